package pingback

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// The history (GET /pingback/history, the console's charts) is counted in
// memory per store handle, per minute, and written once a minute as one
// small record per instance and minute (store.HistoryStore): no row is
// updated per pingback. The hot path only takes historyRecorder's mutex
// to add to a map entry or a bucket.

// historyWriteTimeout bounds the write of the minute records (and the
// sample of the backlog) once a minute; historyCloseTimeout at close,
// which it delays.
const (
	historyWriteTimeout = 10 * time.Second
	historyCloseTimeout = 5 * time.Second
)

// historyPendingMax bounds the finished minutes waiting to be written
// (the store away for that long): the oldest are dropped beyond it, with
// a log line.
const historyPendingMax = 120

// historyRecorder counts one store handle's figures of the current minute
// and keeps the finished minutes until they are written.
type historyRecorder struct {
	store  store.Store
	hs     store.HistoryStore // nil: the store keeps no history
	logger *zap.Logger

	mu      sync.Mutex
	cur     store.HistoryMinute   // the minute being counted (zero Minute: none yet)
	done    []store.HistoryMinute // finished minutes not yet written, oldest first
	dropped int                   // finished minutes dropped (historyPendingMax) since the last log line
	flushed time.Time             // the minute whose end the last round sampled

	// clock is the owning app's clock (App.now), set by its replay loop:
	// what noteExpired and the write at close count by.
	clock   atomic.Pointer[func() time.Time]
	writing atomic.Bool // a round's write is under way
}

func newHistoryRecorder(st store.Store, logger *zap.Logger) *historyRecorder {
	r := &historyRecorder{store: st, logger: logger}
	r.hs, _ = st.(store.HistoryStore)
	now := time.Now
	r.clock.Store(&now)
	return r
}

func (r *historyRecorder) now() time.Time { return (*r.clock.Load())() }

// minuteAt returns the figures of the minute of t, with r.mu held: the
// current minute, rolled over into done when t is in a later one. A t
// before the current minute (a clock step back) counts into it.
func (r *historyRecorder) minuteAt(t time.Time) *store.HistoryMinute {
	m := t.UTC().Truncate(time.Minute)
	if m.After(r.cur.Minute) {
		r.roll(m)
	}
	return &r.cur
}

// roll ends the current minute (kept in done if anything was counted or
// sampled in it) and starts m.
func (r *historyRecorder) roll(m time.Time) {
	if !r.cur.Minute.IsZero() {
		r.done = append(r.done, r.cur)
		if n := len(r.done) - historyPendingMax; n > 0 {
			r.done = slices.Delete(r.done, 0, n)
			r.dropped += n
		}
	}
	r.cur = store.HistoryMinute{Minute: m, Instance: r.store.Owner()}
}

// count adds one to the figure name of what (Received or Deliveries) in
// the minute of t.
func (r *historyRecorder) count(t time.Time, what func(*store.HistoryMinute) *map[string]int64, name string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := what(r.minuteAt(t))
	if *m == nil {
		*m = map[string]int64{}
	}
	(*m)[name]++
}

// countNow is count at the owning app's time.
func (r *historyRecorder) countNow(what func(*store.HistoryMinute) *map[string]int64, name string) {
	if r != nil {
		r.count(r.now(), what, name)
	}
}

func received(m *store.HistoryMinute) *map[string]int64   { return &m.Received }
func deliveries(m *store.HistoryMinute) *map[string]int64 { return &m.Deliveries }

// delivered counts a delivery at t, delay after its receipt and age after
// its task's submission (or its receipt).
func (r *historyRecorder) delivered(t time.Time, delay, age time.Duration) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.minuteAt(t)
	if m.Delay == nil {
		m.Delay, m.Age = make([]uint64, store.HistoryBuckets), make([]uint64, store.HistoryBuckets)
	}
	if m.Deliveries == nil {
		m.Deliveries = map[string]int64{}
	}
	m.Deliveries[store.OutcomeDelivered]++
	m.Delay[store.HistoryBucket(delay)]++
	m.Age[store.HistoryBucket(age)]++
}

// take returns the finished minutes to write (and, if all, a copy of the
// current one too), emptying done; sample is the minute whose end the
// backlog sample belongs to (the last finished one, or the current one
// with all), added empty when nothing was counted in it.
func (r *historyRecorder) take(now time.Time, all bool) (out []store.HistoryMinute, sample int, dropped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := now.UTC().Truncate(time.Minute)
	if m.After(r.cur.Minute) {
		r.roll(m)
	}
	prev := m.Add(-time.Minute)
	if n := len(r.done); !all && (n == 0 || r.done[n-1].Minute.Before(prev)) && r.flushed.Before(prev) {
		r.done = append(r.done, store.HistoryMinute{Minute: prev, Instance: r.store.Owner()})
	}
	out, r.done = r.done, nil
	sample = slices.IndexFunc(out, func(x store.HistoryMinute) bool { return x.Minute.Equal(prev) })
	if all {
		c := r.cur
		c.Received, c.Deliveries, c.Backlog = maps.Clone(c.Received), maps.Clone(c.Deliveries), maps.Clone(c.Backlog)
		c.Delay, c.Age = slices.Clone(c.Delay), slices.Clone(c.Age)
		out = append(out, c)
		sample = len(out) - 1
	}
	if !all {
		r.flushed = prev
	}
	dropped, r.dropped = r.dropped, 0
	return out, sample, dropped
}

// giveBack returns minutes whose write failed to done, to be written with
// the next round's.
func (r *historyRecorder) giveBack(ms []store.HistoryMinute) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = append(ms, r.done...)
	if n := len(r.done) - historyPendingMax; n > 0 {
		r.done = slices.Delete(r.done, 0, n)
		r.dropped += n
	}
}

// write samples the backlog into ms[sample] (if sample ≥ 0) and writes
// ms; those it could not write are given back.
func (r *historyRecorder) write(ctx context.Context, now time.Time, ms []store.HistoryMinute, sample, dropped int) {
	if dropped > 0 {
		r.logger.Warn("history: minutes dropped unwritten (the store refused their writes for too long)", zap.Int("minutes", dropped))
	}
	if len(ms) == 0 {
		return
	}
	if sample >= 0 {
		if c, err := r.store.Counts(ctx); err == nil {
			ms[sample].Backlog, ms[sample].SampledAt = backlogOf(c), now.UTC()
		}
	}
	for i, m := range ms {
		if err := r.hs.WriteMinute(ctx, m); err != nil {
			if !errors.Is(err, store.ErrClosed) {
				r.logger.Error("history: writing the minute's figures failed; retried next minute",
					zap.Time("minute", m.Minute), zap.Error(err))
				r.giveBack(ms[i:])
			}
			return
		}
	}
}

// backlogOf sums the records of every provider by state, delivered left
// out.
func backlogOf(c store.Counts) map[store.State]int64 {
	out := map[store.State]int64{}
	for _, states := range c.Records {
		for st, n := range states {
			if st != store.StateDelivered {
				out[st] += n
			}
		}
	}
	return out
}

// historyRound is the replay loop's part of the history, each round: at
// the first round of a minute, the finished minutes are written, in the
// background (the loop never waits for the store's write).
func (a *App) historyRound() {
	h := a.handle
	r := h.history
	if r == nil {
		return
	}
	r.clock.Store(&a.now)
	if r.hs == nil {
		return
	}
	now := a.now()
	r.mu.Lock()
	due := now.UTC().Truncate(time.Minute).Add(-time.Minute).After(r.flushed)
	r.mu.Unlock()
	if !due || !r.writing.CompareAndSwap(false, true) {
		return
	}
	if !h.track() {
		r.writing.Store(false)
		return
	}
	ms, sample, dropped := r.take(now, false)
	go func() {
		defer h.untrack()
		defer r.writing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), historyWriteTimeout)
		defer cancel()
		r.write(ctx, now, ms, sample, dropped)
	}()
}

// flushAll writes every minute not yet written, the current one so far
// included: at close, so that a restart loses none of it.
func (r *historyRecorder) flushAll() {
	if r == nil || r.hs == nil {
		return
	}
	now := r.now()
	ms, sample, dropped := r.take(now, true)
	ctx, cancel := context.WithTimeout(context.Background(), historyCloseTimeout)
	defer cancel()
	r.write(ctx, now, ms, sample, dropped)
}

// pending returns copies of the minutes in [from, to) not yet written:
// the finished ones waiting and the current one.
func (r *historyRecorder) pending(from, to time.Time) []store.HistoryMinute {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []store.HistoryMinute
	for _, m := range append(slices.Clone(r.done), r.cur) {
		if m.Minute.IsZero() || m.Minute.Before(from) || !m.Minute.Before(to) {
			continue
		}
		m.Received, m.Deliveries, m.Backlog = maps.Clone(m.Received), maps.Clone(m.Deliveries), maps.Clone(m.Backlog)
		m.Delay, m.Age = slices.Clone(m.Delay), slices.Clone(m.Age)
		out = append(out, m)
	}
	return out
}

// countReceived counts a result received in callbacks_total (provider,
// result) and in the history.
func (a *App) countReceived(provider, result string) {
	a.countReceivedWith(a.metrics.callbacks.WithLabelValues(provider, result), result)
}

// countReceivedWith is countReceived for c, the callbacks_total counter
// of result that a caller keeps.
func (a *App) countReceivedWith(c prometheus.Counter, result string) {
	c.Inc()
	if h := a.readyHandle(); h != nil {
		h.history.count(a.now(), received, result)
	}
}

// noteForwardEnded counts the end of the forward d in the history and,
// for a delivery, delivery_age_seconds.
func (a *App) noteForwardEnded(d delivery, out outcome) {
	h := a.readyHandle()
	now := a.now()
	if out.class != delivered {
		if h != nil {
			h.history.count(now, deliveries, out.class.String())
		}
		return
	}
	age := now.Sub(resultBorn(d.rec))
	a.metrics.deliveryAge.WithLabelValues(d.rec.Provider, string(d.src)).Observe(max(0, age.Seconds()))
	if h != nil {
		h.history.delivered(now, now.Sub(d.rec.ReceivedAt), age)
	}
}

// noteParked counts a result parked in the history.
func (h *storeHandle) noteParked() { h.history.countNow(deliveries, "parked") }

// noteExpired counts in the history a result that expired for its
// provider's max_age (never forwarded). The history counts every provider
// together.
func (h *storeHandle) noteExpired() {
	h.history.countNow(deliveries, "expired")
}

// pruneHistory deletes the minute records older than the retention
// (housekeeping).
func (a *App) pruneHistory(st store.Store) {
	hs, ok := st.(store.HistoryStore)
	if !ok {
		return
	}
	if _, err := hs.PruneMinutes(a.loopCtx, a.now().Add(-time.Duration(a.Retention))); err != nil &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrClosed) {
		a.logger.Error("history: pruning minutes older than the retention", zap.Error(err))
	}
}

// History implements admin.Backend: the store's minute records of
// [from, to) merged with this process's not yet written (which replace
// this instance's record of the same minute).
func (a *App) History(ctx context.Context, from, to time.Time) (adminapi.HistoryAnswer, error) {
	h := a.readyHandle()
	if h == nil {
		if a.store(time.Second) == nil {
			return adminapi.HistoryAnswer{}, adminError(errStoreUnavailable)
		}
		h = a.readyHandle()
	}
	if h.history == nil || h.history.hs == nil {
		return adminapi.NewHistoryAnswer(from, to, nil), nil
	}
	stored, err := h.history.hs.Minutes(ctx, from, to)
	if err != nil {
		return adminapi.HistoryAnswer{}, err
	}
	mine := h.history.pending(from, to)
	type slot struct {
		minute   int64
		instance string
	}
	local := make(map[slot]bool, len(mine))
	for _, m := range mine {
		local[slot{m.Minute.Unix(), m.Instance}] = true
	}
	stored = slices.DeleteFunc(stored, func(m store.HistoryMinute) bool { return local[slot{m.Minute.Unix(), m.Instance}] })
	return adminapi.NewHistoryAnswer(from, to, append(stored, mine...)), nil
}

// HistorySpan implements admin.Backend: the retention.
func (a *App) HistorySpan() time.Duration { return time.Duration(a.Retention) }
