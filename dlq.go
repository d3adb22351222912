package pingback

import (
	"context"
	"errors"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// The dead-letter queue is the set of records in state failed (retried
// here with backoff), rejected or parked (kept, visible, not retried), plus
// records stuck in state forwarding after a crash (replayed here). Every
// replay reaches the app through dispatch: the same server, route and next
// handler as a live callback.

// recordOutcome stores the outcome of forward number attempt. It is a no-op
// if the record has moved on to a later attempt meanwhile.
func (a *App) recordOutcome(st store.Store, key store.Key, attempt int, out outcome) {
	now := a.now().UTC()
	r := a.Replay
	rec, err := st.UpdateDelivery(context.Background(), key, func(rec *store.Delivery) error {
		if rec.Attempts != attempt {
			return store.ErrSkip
		}
		rec.LastStatus = out.status
		rec.LastError = out.errorText()
		rec.UpdatedAt = now
		rec.DueAt = time.Time{}
		switch {
		case out.class == delivered:
			rec.State = store.StateDelivered
		case out.class == rejected:
			rec.State = store.StateRejected
		case rec.Attempts >= r.MaxAttempts:
			rec.State = store.StateParked
		default:
			rec.State = store.StateFailed
			rec.DueAt = now.Add(a.backoff(rec.Attempts))
		}
		return nil
	})
	switch {
	case errors.Is(err, store.ErrSkip):
		return
	case err != nil:
		// The record stays "forwarding" and is replayed after stuck_after.
		a.logger.Error("recording forward outcome failed; the result will be replayed",
			zap.String("key", key.String()), zap.Int("attempt", attempt), zap.Error(err))
		return
	}
	if rec.State == store.StateParked {
		a.noteParked(key, rec)
	}
}

// forwardDeadline is when a forward of a record that is due again at dueAt
// (the moment the replay loop would take it as stuck) must have ended: a
// little before, so that a forward and the replay of the same attempt never
// overlap.
func forwardDeadline(dueAt time.Time, stuck time.Duration) time.Time {
	return dueAt.Add(-min(time.Second, stuck/10))
}

// backoff is the delay before the retry that follows attempt n (n >= 1):
// uniform in [min, cap] where cap = min(max, min·2^(n-1)) (exponential
// backoff with jitter, kept at or above min).
func (a *App) backoff(n int) time.Duration {
	lo := time.Duration(a.Replay.BackoffMin)
	hi := time.Duration(a.Replay.BackoffMax)
	capd := lo
	for i := 1; i < n && capd < hi; i++ {
		capd *= 2
	}
	capd = min(capd, hi)
	if capd <= lo {
		return lo
	}
	return lo + time.Duration(a.jitter(int64(capd-lo)+1))
}

// replayLoop retries due records while this app owns the store's loops.
func (a *App) replayLoop() {
	defer close(a.loopDone)
	defer func() {
		if err := recover(); err != nil {
			a.logger.Error("replay loop panicked", zap.Any("error", err), zap.ByteString("stack", debug.Stack()))
		}
	}()
	tick := min(max(time.Duration(a.Replay.BackoffMin)/4, 20*time.Millisecond), time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	sem := a.inflight
	for {
		select {
		case <-a.stop:
			a.drain(sem)
			return
		case <-t.C:
		}
		if !a.handle.owns(a) {
			continue
		}
		a.replayDue(sem)
	}
}

// replayDue claims the records due now and dispatches them, at most
// Concurrency at once.
func (a *App) replayDue(sem chan struct{}) {
	st := a.handle.store
	now := a.now().UTC()
	due, err := st.Due(a.ctx, now, 4*cap(sem))
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			a.logger.Error("scanning the dead-letter queue", zap.Error(err))
		}
		return
	}
	for _, rec := range due {
		select {
		case sem <- struct{}{}:
		case <-a.stop:
			return
		}
		claimed, ok := a.claim(st, rec, now)
		if !ok {
			<-sem
			continue
		}
		go func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithDeadline(a.ctx, forwardDeadline(claimed.DueAt, time.Duration(a.Replay.StuckAfter)))
			defer cancel()
			out := a.dispatch(ctx, claimed, "replay", claimed.Attempts)
			a.metrics.forwards.WithLabelValues(claimed.Provider, "replay", out.class.String()).Inc()
			a.recordOutcome(st, claimed.Key(), claimed.Attempts, out)
		}()
	}
}

// claim takes a due record (as Due read it) for one more attempt: state
// forwarding, attempt count up, due again after stuck_after in case this
// replay never reports. A stuck record that has used all its attempts is
// parked instead. It returns the record with its new delivery state.
func (a *App) claim(st store.Store, due *store.Record, now time.Time) (*store.Record, bool) {
	key := due.Key()
	var parked bool
	d, err := st.UpdateDelivery(a.ctx, key, func(rec *store.Delivery) error {
		if rec.DueAt.IsZero() || rec.DueAt.After(now) {
			return store.ErrSkip
		}
		rec.UpdatedAt = now
		if rec.Attempts >= a.Replay.MaxAttempts {
			parked = true
			rec.State = store.StateParked
			rec.DueAt = time.Time{}
			if rec.LastError == "" {
				rec.LastError = "forward did not finish"
			}
			return nil
		}
		rec.State = store.StateForwarding
		rec.Attempts++
		rec.DueAt = now.Add(time.Duration(a.Replay.StuckAfter))
		return nil
	})
	switch {
	case errors.Is(err, store.ErrSkip):
		return nil, false
	case err != nil:
		a.logger.Error("claiming a record for replay", zap.String("key", key.String()), zap.Error(err))
		return nil, false
	case parked:
		a.noteParked(key, d)
		return nil, false
	}
	rec := *due
	rec.SetDelivery(d)
	return &rec, true
}

// noteParked counts and logs a result that was just parked.
func (a *App) noteParked(key store.Key, d store.Delivery) {
	a.metrics.parked.WithLabelValues(key.Provider).Inc()
	a.logger.Warn("result parked after max_attempts; replay it by hand (POST /pingback/records/<provider>/<id>/replay on the admin endpoint)",
		zap.String("key", key.String()), zap.Int("attempts", d.Attempts), zap.String("last_error", d.LastError))
}

// drain waits for the forwards in flight, then frees the slots again for
// polled results still being delivered while the app stops.
func (a *App) drain(sem chan struct{}) {
	for range cap(sem) {
		sem <- struct{}{}
	}
	for range cap(sem) {
		<-sem
	}
}

// errInFlight means a record's forward is under way and not yet stuck.
var errInFlight = errors.New("a forward of this result is in flight")

// redrive replays one record now, by hand, whatever its state (parked,
// rejected, failed, even delivered), through the same path as the replay
// loop, and returns the record after the attempt. A retryable failure of a
// record past max_attempts parks it again. It fails with errInFlight while a
// forward is under way, and store.ErrNotFound for an unknown key.
func (a *App) redrive(ctx context.Context, key store.Key) (*store.Record, error) {
	st := a.store(time.Second)
	if st == nil {
		return nil, errStoreUnavailable
	}
	now := a.now().UTC()
	stuck := time.Duration(a.Replay.StuckAfter)
	rec, err := st.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	d, err := st.UpdateDelivery(ctx, key, func(rec *store.Delivery) error {
		if rec.State == store.StateForwarding && rec.DueAt.After(now) {
			return errInFlight
		}
		rec.State = store.StateForwarding
		rec.Attempts++
		rec.DueAt = now.Add(stuck)
		rec.UpdatedAt = now
		return nil
	})
	if err != nil {
		return nil, err
	}
	rec.SetDelivery(d)
	dctx, cancel := context.WithDeadline(ctx, forwardDeadline(d.DueAt, stuck))
	defer cancel()
	out := a.dispatch(dctx, rec, "replay", rec.Attempts)
	a.metrics.forwards.WithLabelValues(rec.Provider, "replay", out.class.String()).Inc()
	a.recordOutcome(st, key, rec.Attempts, out)
	a.logger.Info("result replayed by hand", zap.String("key", key.String()),
		zap.Int("attempt", rec.Attempts), zap.String("outcome", out.class.String()))
	return st.Get(ctx, key)
}
