package pingback

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

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
//
// Every forward of a result to the app, live or from the loops, is one
// call of deliver: the record is leased to this process (by the insert of a
// live callback, or by a claim), the forward runs under forward_timeout and
// is cut 2 s after its config begins to stop, the lease is renewed while it
// runs if the store wants renewals, and the outcome is recorded and counted.
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
	a.noteForwardEnded(d, out)
	a.observeRoute(d, out)
	a.noteRouteHealth(d, out)
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
		// The store is being closed: record the outcome now, while a
		// replay's own tracking (replayDue) still holds the store open;
		// if it closed already, the lease lapses with it and the next
		// open replays the result.
		a.recordOutcome(context.Background(), d.st, d.rec.Key(), attempt, out)
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
	case out.throttled():
		// The app asked to wait: retried no sooner than its Retry-After
		// (capped by backoff's maximum) nor its own backoff, and not
		// counted toward max_attempts (retention bounds it).
		wait := max(a.backoff(d.Failures+1), min(out.retryAfter, time.Duration(a.Replay.BackoffMax)))
		d.State, d.DueAt = store.StateFailed, now.Add(wait)
	default: // failed or timed out
		d.Failures++
		if d.Failures >= a.Replay.MaxAttempts {
			d.State = store.StateParked
			return
		}
		d.State, d.DueAt = store.StateFailed, now.Add(a.backoff(d.Failures))
	}
}

// outcomeClass is what a forward's result means for the record.
type outcomeClass int

const (
	// delivered: the app answered 2xx or 3xx (or nothing answered, which
	// Caddy sends as an empty 200).
	delivered outcomeClass = iota
	// retryable: a transport error, 5xx, 408 or 429; the replay loop
	// retries it.
	retryable
	// rejected: any other 4xx; kept, not retried automatically.
	rejected
	// timedOut: the app did not answer within forward_timeout; a failure
	// like retryable.
	timedOut
	// interrupted: the forward was cut before it ended (the config
	// stopped, or the lease was lost); not a failure, replayed at once.
	interrupted
)

// String is the class as the forwards_total metric's outcome label.
func (c outcomeClass) String() string {
	switch c {
	case delivered:
		return "delivered"
	case retryable:
		return "failed"
	case timedOut:
		return "timeout"
	case interrupted:
		return "interrupted"
	default:
		return "rejected"
	}
}

// failed reports whether the class is an attempt that failed and counts
// toward max_attempts.
func (c outcomeClass) failed() bool { return c == retryable || c == timedOut }

// outcome is the result of one forward to the app.
type outcome struct {
	class  outcomeClass
	status int   // the app's status, or the handler error's status; 0 if the app gave none
	err    error // the handler chain's error, if any
	// retryAfter is the wait the app's Retry-After asked for on a 429 or
	// 503 (0: none; see retryAfter).
	retryAfter time.Duration
}

// throttled reports whether the app asked for less traffic: a 429, or a
// 503 with Retry-After. Such an attempt is a failure in the record's
// history but does not count toward max_attempts, and it lowers the
// route's replay concurrency (routeFlow).
func (o outcome) throttled() bool {
	return o.class == retryable && (o.status == http.StatusTooManyRequests ||
		o.status == http.StatusServiceUnavailable && o.retryAfter > 0)
}

// Why a forward's context ended early (context.Cause).
var (
	errForwardTimeout = errors.New("app did not answer within forward_timeout")
	errCut            = errors.New("interrupted: Caddy stopped or reloaded its config while the forward ran")
	errLeaseLost      = errors.New("interrupted: the lease of this forward could not be renewed")
)

// cutShort turns the outcome of a forward whose context ended early (cause
// is context.Cause of it) into a timeout or an interruption, with no app
// status. A delivery stands: the app took the result.
func cutShort(out outcome, cause error) outcome {
	if out.class == delivered || cause == nil {
		return out
	}
	switch {
	case errors.Is(cause, errForwardTimeout):
		return outcome{class: timedOut, err: cause}
	case errors.Is(cause, errCut), errors.Is(cause, errLeaseLost):
		return outcome{class: interrupted, err: cause}
	}
	return out
}

// forward runs next on r with a response writer that keeps the app's answer
// away from the provider, and classifies what happened.
//
// A panic in the handler chain (reverse_proxy aborts with
// http.ErrAbortHandler when the app's body breaks off after its headers,
// for example when forward_timeout cuts it) is recovered here: it must not
// crash Caddy from a replay goroutine. A 2xx or 3xx already written counts
// as delivered; anything else as a retryable failure.
func forward(r *http.Request, next caddyhttp.Handler) (out outcome) {
	rec := caddyhttp.NewResponseRecorder(discardWriter{h: make(http.Header)}, nil, nil)
	defer func() {
		if v := recover(); v != nil {
			out = recovered(v, rec.Status())
		}
	}()
	err := next.ServeHTTP(rec, r)
	out = classify(rec.Status(), err)
	if err == nil {
		out.retryAfter = retryAfter(out.status, rec.Header(), time.Now())
	}
	return out
}

// recovered is the outcome of a forward whose handler chain panicked with
// v after writing status (0 if none).
func recovered(v any, status int) outcome {
	if status >= 200 && status < 400 {
		return outcome{class: delivered, status: status}
	}
	return outcome{class: retryable, err: fmt.Errorf("handler aborted the forward: %v", v)}
}

// classify maps the next handler's status and error to an outcome. A handler
// error carries its status (reverse_proxy: 502 for a refused connection, 504
// for a timeout, 499 if the request context ended); an error without a
// status counts as 502.
func classify(status int, err error) outcome {
	if err != nil {
		status = http.StatusBadGateway
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode != 0 {
			status = he.StatusCode
		}
		out := outcome{class: classOf(status), status: status, err: err}
		if out.class == delivered {
			// An error is never a delivery, whatever status it claims.
			out.class = retryable
		}
		return out
	}
	if status == 0 {
		status = http.StatusOK
	}
	return outcome{class: classOf(status), status: status}
}

func classOf(status int) outcomeClass {
	switch {
	case status < 400:
		return delivered
	case status >= 500, status == http.StatusRequestTimeout, status == http.StatusTooManyRequests,
		status == 499: // client (here: our own deadline) closed the request
		return retryable
	default:
		return rejected
	}
}

// errorText summarises an outcome for the record's last_error.
func (o outcome) errorText() string {
	switch {
	case o.class == timedOut:
		return errForwardTimeout.Error()
	case o.err != nil:
		return o.err.Error()
	case o.class != delivered:
		return fmt.Sprintf("app answered %d", o.status)
	}
	return ""
}

// discardWriter is the innermost response writer of a forward: the app's
// answer is recorded (status) and dropped.
type discardWriter struct{ h http.Header }

func (d discardWriter) Header() http.Header { return d.h }

func (d discardWriter) Write(p []byte) (int, error) { return len(p), nil }

func (d discardWriter) WriteHeader(int) {}

// backoff is the delay before the retry that follows failure n (n >= 1):
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
