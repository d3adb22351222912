package pingback

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// delayQueueSize bounds the submit-to-pingback delays waiting to be
// written to a shared store. A delay only feeds the automatic "after"
// estimate (which needs 20 of the last 1024), so dropping some when the
// database is slow loses nothing a pingback depends on.
const delayQueueSize = 256

// delayLogEvery is how often dropped delays are logged at most.
const delayLogEvery = time.Minute

// observedDelay is one delay waiting for the shared store.
type observedDelay struct {
	provider string
	d        time.Duration
}

// delayWriter writes the delays of a shared store (store.SharedPolling)
// from one goroutine, through a queue of delayQueueSize: a slow or
// unreachable database holds at most one connection and one goroutine for
// them, never one per pingback, so they cannot pile up in front of the
// insert batchers. A delay that finds the queue full is dropped, counted
// and logged at warn level: the first drop at once, then at most one line
// a minute, each with the count since the last line and the total.
type delayWriter struct {
	sp     store.SharedPolling
	logger *zap.Logger
	queue  chan observedDelay

	dropped  atomic.Int64 // delays dropped since the start
	logged   atomic.Int64 // dropped when last logged
	loggedAt atomic.Int64 // unix nanoseconds of the last drop log line
	ctx      context.Context
	cancel   context.CancelFunc
	done     chan struct{}
}

func newDelayWriter(sp store.SharedPolling, logger *zap.Logger) *delayWriter {
	ctx, cancel := context.WithCancel(context.Background())
	w := &delayWriter{sp: sp, logger: logger, queue: make(chan observedDelay, delayQueueSize),
		ctx: ctx, cancel: cancel, done: make(chan struct{})}
	go w.run()
	return w
}

// observe queues one delay without waiting; it reports false (and counts
// the delay as dropped) when the queue is full.
func (w *delayWriter) observe(provider string, d time.Duration) bool {
	select {
	case w.queue <- observedDelay{provider, d}:
		return true
	default:
		n := w.dropped.Add(1)
		now := time.Now().UnixNano()
		last := w.loggedAt.Load()
		if (last == 0 || now-last >= int64(delayLogEvery)) && w.loggedAt.CompareAndSwap(last, now) {
			prev := w.logged.Swap(n)
			w.logger.Warn("pingback delays not recorded in the shared store: the queue to the database is full (the automatic \"after\" uses the others)",
				zap.Int64("dropped", n-prev), zap.Int64("dropped_total", n), zap.Duration("log_every", delayLogEvery))
		}
		return false
	}
}

// run writes the queued delays one after another until stop.
func (w *delayWriter) run() {
	defer close(w.done)
	for {
		select {
		case <-w.ctx.Done():
			return
		case od := <-w.queue:
			ctx, cancel := context.WithTimeout(w.ctx, sharedTimeout)
			err := w.sp.ObserveDelay(ctx, od.provider, od.d)
			cancel()
			if err != nil && w.ctx.Err() == nil {
				w.logger.Debug("recording a pingback delay in the shared store failed", zap.String("provider", od.provider), zap.Error(err))
			}
		}
	}
}

// stop ends the writer (a write in flight is cancelled) and waits for it;
// queued delays are dropped. Safe to call more than once.
func (w *delayWriter) stop() {
	w.cancel()
	<-w.done
}

// delayWriterOf returns the handle's delay writer, started at the first
// call; nil if the store is not shared.
func (h *storeHandle) delayWriterOf(logger *zap.Logger) *delayWriter {
	sp := h.sharedPolling()
	if sp == nil {
		return nil
	}
	h.delaysOnce.Do(func() {
		h.mu.Lock()
		closing := h.closing
		h.mu.Unlock()
		if !closing {
			h.delays = newDelayWriter(sp, logger)
		}
	})
	return h.delays
}

// stopDelays stops the delay writer, if one started (Destruct, before the
// store closes).
func (h *storeHandle) stopDelays() {
	h.delaysOnce.Do(func() {}) // none starts after this
	if h.delays != nil {
		h.delays.stop()
	}
}

// sharedAfterTTL is how long an instance uses the shared "after" estimate
// before reading the delays again.
const sharedAfterTTL = 10 * time.Second

// observeDelay records one submit-to-pingback delay of the provider, for
// the automatic "after": in memory, and in the store if it is shared,
// through the handle's one delay writer (queued without waiting; dropped
// and counted when the queue is full: delayWriter).
func (h *storeHandle) observeDelay(name string, d time.Duration, logger *zap.Logger) {
	h.provider(name).latencies.observe(d)
	if w := h.delayWriterOf(logger); w != nil {
		w.observe(name, d)
	}
}

// autoAfter is the automatic overdue delay of the provider: from the
// delays every instance observed if the store is shared (read again every
// sharedAfterTTL), else from this process's.
func (a *App) autoAfter(name string) time.Duration {
	ps := a.handle.provider(name)
	sp := a.handle.sharedPolling()
	if sp == nil {
		return ps.latencies.after()
	}
	ps.mu.Lock()
	cached, at := ps.sharedAfter, ps.sharedAfterAt
	ps.mu.Unlock()
	if !at.IsZero() && time.Since(at) < sharedAfterTTL {
		return cached
	}
	ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
	defer cancel()
	delays, err := sp.RecentDelays(ctx, name, autoAfterSamples)
	if err != nil {
		if at.IsZero() {
			return ps.latencies.after()
		}
		return cached
	}
	l := latencies{ring: delays}
	after := l.after()
	ps.mu.Lock()
	ps.sharedAfter, ps.sharedAfterAt = after, time.Now()
	ps.mu.Unlock()
	return after
}

// observeDelay records one submit-to-pingback delay of provider, for the
// poller's automatic "after" (storeHandle.observeDelay).
func (a *App) observeDelay(provider string, d time.Duration, logger *zap.Logger) {
	a.handle.observeDelay(provider, d, logger)
}

// Bounds of the automatic "after" (poll config): the delay from submission
// after which a task's pingback counts as overdue.
const (
	autoAfterMin = 20 * time.Second
	autoAfterMax = 120 * time.Second
	// autoAfterSamples is how many recent delays the estimate uses, and
	// autoAfterMinSamples how many it needs before it departs from the
	// conservative autoAfterMax (the tutorial's fixed 120 s).
	autoAfterSamples    = 256
	autoAfterMinSamples = 20
)

// latencies keeps the recent submit-to-pingback delays of one provider and
// derives the automatic "after" from them: 1.5 × their 95th percentile,
// clamped to [20s, 120s]. It lives in memory; after a restart the estimate
// starts again from 120 s.
type latencies struct {
	mu   sync.Mutex
	ring []time.Duration
	next int
}

// observe records one submit-to-pingback delay.
func (l *latencies) observe(d time.Duration) {
	if d < 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ring) < autoAfterSamples {
		l.ring = append(l.ring, d)
		return
	}
	l.ring[l.next] = d
	l.next = (l.next + 1) % autoAfterSamples
}

// after returns the automatic overdue delay.
func (l *latencies) after() time.Duration {
	l.mu.Lock()
	sorted := slices.Clone(l.ring)
	l.mu.Unlock()
	if len(sorted) < autoAfterMinSamples {
		return autoAfterHigh()
	}
	slices.Sort(sorted)
	p95 := sorted[(len(sorted)*95+99)/100-1]
	return min(max(p95*3/2, autoAfterLow()), autoAfterHigh())
}
