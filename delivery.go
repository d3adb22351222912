package pingback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Every forward of a result to the app, live or from the loops, is one
// call of deliver: the record is leased to this process (by the insert of a
// live callback, or by a claim), the forward runs under forward_timeout and
// is cut 2 s after its config begins to stop, the lease is renewed while it
// runs if the store wants renewals, and the outcome is recorded and counted.

const (
	// leaseGrace is how much longer than forward_timeout a lease that is
	// never renewed lasts: the forward has surely ended by then, so a lease
	// still held is one whose outcome could not be recorded.
	leaseGrace = 10 * time.Second
	// cutAfter is how long the forwards of a config that stops may still
	// run before they are cut and recorded as interrupted.
	cutAfter = 2 * time.Second
	// maxInterrupts is how many forwards of one result may be cut by a
	// crash in a row (a result that crashes Caddy, say) before it is parked.
	maxInterrupts = 5
	// outcomeRetries bounds the tries to record one outcome.
	outcomeRetries = 5
)

// delivery is one forward of a leased record.
type delivery struct {
	st  store.Store // nil: the record is not stored (commit failed); nothing to record
	rec *store.Record
	src store.Source
	// send forwards the record with ctx and classifies the app's answer.
	send func(ctx context.Context) outcome
	// route names where the forward goes (host and path), for logs.
	route string
	// background records the outcome in the background (the live path:
	// the provider's connection is not held for a second commit; the
	// replay loop: the slot frees when the forward ends).
	background bool
}

// deliver forwards d.rec once and records the outcome; it returns the
// outcome as soon as the forward has ended.
func (a *App) deliver(ctx context.Context, d delivery) outcome {
	attempt := d.rec.Attempts
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// forward_timeout, but never past the lease (less a margin): the
	// lease was taken before the waits of the claim or insert, and a lease
	// that is not renewed must not lapse while its forward runs.
	timeout := time.Duration(a.Replay.ForwardTimeout)
	if d.st != nil && d.st.LeaseTerm() == 0 {
		timeout = min(timeout, d.rec.Lease.Until.Sub(a.now())-leaseGrace/2)
	}
	fctx, cancelTimeout := context.WithTimeoutCause(fctx, timeout, errForwardTimeout)
	defer cancelTimeout()
	stopCut := context.AfterFunc(a.cutCtx, func() { cancel(errCut) })
	defer stopCut()
	stopRenew := func() {}
	if d.st != nil {
		if term := d.st.LeaseTerm(); term > 0 {
			stopRenew = a.renewWhileRunning(fctx, cancel, d.st, d.rec.Key(), attempt, term)
		}
	}

	started := time.Now()
	out := cutShort(d.send(fctx), context.Cause(fctx))
	took := time.Since(started)
	stopRenew()
	a.metrics.forwards.WithLabelValues(d.rec.Provider, string(d.src), out.class.String()).Inc()
	a.metrics.forwardDuration.WithLabelValues(string(d.src), out.class.String()).Observe(took.Seconds())
	if h := a.readyHandle(); h != nil && (out.class.failed() || out.class == rejected) && h.failures.allow(d.route) {
		a.logger.Warn("forward to the app failed (further ones are counted in a summary line each minute)",
			zap.String("key", d.rec.Key().String()), zap.Int("attempt", attempt), zap.String("route", d.route),
			zap.String("outcome", out.class.String()), zap.Int("status", out.status), zap.String("reason", out.errorText()))
	}
	if d.st == nil {
		return out
	}
	if !d.background {
		a.recordOutcome(context.Background(), d.st, d.rec.Key(), attempt, out)
		return out
	}
	if !a.handle.track() {
		// The store is being closed: the lease lapses with it and the
		// next open replays the result.
		return out
	}
	go func() {
		defer a.handle.untrack()
		// Nobody waits for this commit: it may wait a moment to share
		// the next pingback's sync.
		a.recordOutcome(store.Deferrable(context.Background()), d.st, d.rec.Key(), attempt, out)
	}()
	return out
}

// renewWhileRunning renews the lease of a forward every third of term
// until ctx ends; a renewal that fails cuts the forward (before the lease
// lapses, so two owners never forward at once).
func (a *App) renewWhileRunning(ctx context.Context, cancel context.CancelCauseFunc, st store.Store, key store.Key, attempt int, term time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(term / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, term/3)
			err := st.Renew(rctx, key, attempt, a.now().UTC().Add(term))
			rcancel()
			if err != nil && ctx.Err() == nil {
				a.logger.Warn("lease renewal failed; cutting the forward so that no other owner overlaps it",
					zap.String("key", key.String()), zap.Int("attempt", attempt), zap.Error(err))
				cancel(errLeaseLost)
				return
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done) }) }
}

// leaseFor is the length of a lease on st.
func (a *App) leaseFor(st store.Store) time.Duration {
	if term := st.LeaseTerm(); term > 0 {
		return term
	}
	return time.Duration(a.Replay.ForwardTimeout) + leaseGrace
}

// recordOutcome stores the outcome of forward number attempt, if the
// record is still leased to this handle for that attempt. A store that
// cannot take the write is tried again a few times, and for as long as it
// reports itself unavailable (up to outcomeWaitMax, until it closes); if it
// never takes it, the record keeps its lease, which lapses (at the lease's
// end, or when the store is opened again) and the result is replayed.
func (a *App) recordOutcome(ctx context.Context, st store.Store, key store.Key, attempt int, out outcome) {
	var d store.Delivery
	var err error
	waiting := false // counted in outcomesWaiting
	since := time.Now()
	for try := 1; ; try++ {
		now := a.now().UTC()
		d, err = st.UpdateDelivery(ctx, key, func(d *store.Delivery) error {
			if d.State != store.StateForwarding || d.Attempts != attempt || d.Lease.Owner != st.Owner() {
				return store.ErrSkip
			}
			a.applyOutcome(d, out, now)
			return nil
		})
		if err == nil || errors.Is(err, store.ErrSkip) || errors.Is(err, store.ErrNotFound) ||
			errors.Is(err, store.ErrClosed) {
			break
		}
		if !st.Available() && time.Since(since) < outcomeWaitMax && !a.handle.isClosing() {
			// The store is away (a database outage, a full disk): wait
			// for it, counted in outcomesWaiting so that this process
			// claims nothing meanwhile; once it is back, the outcome is
			// recorded before a claim could take the lapsed lease and
			// forward the result a second time. The tries count again
			// from then.
			if !waiting {
				waiting = true
				a.handle.outcomesWaiting.Add(1)
			}
			try = 0
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if try >= outcomeRetries {
			break
		}
		time.Sleep(time.Duration(try) * 200 * time.Millisecond)
	}
	if waiting {
		a.handle.outcomesWaiting.Add(-1)
	}
	switch {
	case err == nil:
		if d.State == store.StateParked {
			a.noteParked(key, d)
		}
	case errors.Is(err, store.ErrSkip), errors.Is(err, store.ErrNotFound):
	case errors.Is(err, store.ErrClosed):
		a.logger.Info("store closed before a forward's outcome was recorded; the result is replayed when the store opens again",
			zap.String("key", key.String()), zap.Int("attempt", attempt), zap.String("outcome", out.class.String()))
	default:
		a.logger.Error("recording a forward's outcome failed; the result stays leased and is replayed when its lease lapses",
			zap.String("key", key.String()), zap.Int("attempt", attempt),
			zap.String("outcome", out.class.String()), zap.Error(err))
	}
}

// outcomeWaitMax bounds how long an outcome waits for a store that is
// unavailable (a database outage) before it is given up and its lease left
// to lapse.
const outcomeWaitMax = 2 * time.Minute

// applyOutcome moves a forwarding delivery to the state its outcome
// calls for.
func (a *App) applyOutcome(d *store.Delivery, out outcome, now time.Time) {
	d.UpdatedAt = now
	d.LastStatus, d.LastError = out.status, out.errorText()
	status := out.status
	if out.class == interrupted {
		status = 0
	}
	d.EndAttempt(d.Attempts, now, status, out.class.String(), d.LastError)
	d.DueAt, d.Lease = time.Time{}, store.Lease{}
	if out.class != interrupted {
		d.Interrupts = 0 // the attempt ended
	}
	switch {
	case out.class == delivered:
		d.State = store.StateDelivered
	case out.class == rejected:
		d.State = store.StateRejected
	case out.class == interrupted:
		// Cut by a reload or a stop: replayed at once, and not counted
		// toward the crash-park (Interrupts counts lapsed leases).
		d.LastStatus = 0
		d.State, d.DueAt = store.StateQueued, now
	default: // failed or timed out
		d.Failures++
		if d.Failures >= a.Replay.MaxAttempts {
			d.State = store.StateParked
			return
		}
		d.State, d.DueAt = store.StateFailed, now.Add(a.backoff(d.Failures))
	}
}

// decide is the replay loop's claim policy (store.ClaimRequest.DecideRecord):
// a due record, or one whose forward was cut, is leased for one more
// attempt, unless its forwards were cut maxInterrupts times in a row. The
// attempt starts in the history with the source the app is sent
// (sourceFor): correction, poll or callback for a record's first forward
// (a polled result, or a pingback that waited for its confirmation or its
// task's commit), else replay. It is pure.
func decide(now time.Time) func(rec *store.Record, d *store.Delivery, lapsed bool) {
	return func(rec *store.Record, d *store.Delivery, lapsed bool) {
		d.UpdatedAt = now
		if lapsed {
			endInterrupted(d, now)
			d.Interrupts++
			if d.Interrupts >= maxInterrupts {
				park(d, interruptsReason(d))
				return
			}
		}
		d.State = store.StateForwarding
		d.Attempts++
		d.StartAttempt(sourceFor(rec, d.Attempts), now)
	}
}

// endInterrupted ends, in the history, the attempt whose lease lapsed
// (the store set LastError to why).
func endInterrupted(d *store.Delivery, now time.Time) {
	d.EndAttempt(d.Attempts, now, 0, interrupted.String(), d.LastError)
}

// park parks d, saying why in its last error.
func park(d *store.Delivery, why string) {
	d.State, d.DueAt, d.Lease = store.StateParked, time.Time{}, store.Lease{}
	d.LastError = why
}

func interruptsReason(d *store.Delivery) string {
	return fmt.Sprintf("parked: %d forwards in a row were interrupted before they ended (last: %s); does this result crash Caddy?", d.Interrupts, d.LastError)
}

// sourceOf is the X-Pingback-Source of a claimed record's forward, the
// one its history names (decide): sourceFor its attempt.
func sourceOf(rec *store.Record) store.Source { return sourceFor(rec, rec.Attempts) }

// sourceFor is the source of forward number attempt of rec by the replay
// loop: correction for a corrected result; poll for the first forward of
// a polled result, callback for the first forward of a pingback that
// waited (for its confirmation, or for its task's commit); replay for
// every other.
func sourceFor(rec *store.Record, attempt int) store.Source {
	switch {
	case rec.Correction:
		return store.SourceCorrection
	case attempt == 1 && (rec.Source == store.SourcePoll || rec.Source == store.SourceCallback):
		return rec.Source
	}
	return store.SourceReplay
}
