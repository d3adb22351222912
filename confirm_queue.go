package pingback

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Confirmations (res_php, held or tokenless pingbacks) and conflict
// settlements ask the provider in the background. Forged pingbacks cost
// nothing to send, so what they may start is bounded: at most one job per
// key (a second pingback for a key being confirmed or settled is left to
// the job under way, which asks the provider and lets its answer win), and
// at most confirmQueueSize jobs per provider and store, waiting for the
// poller's rate limit or asking. Beyond that a job is dropped and counted
// (caddy_pingback_confirmations_total{outcome="dropped"}, with a throttled
// warn line): a dropped confirmation leaves its record quarantined
// "not_confirmed" (a tracked task is still polled, and the poller's answer
// supersedes it); a dropped settlement keeps the first code and records
// the other as other_code.

// confirmQueueSize is the most confirmation jobs per provider and store.
const confirmQueueSize = 32

// confirmQueue is one store's confirmation jobs: the keys in flight and
// how many jobs each provider has.
type confirmQueue struct {
	mu       sync.Mutex
	inFlight map[store.Key]bool
	jobs     map[string]int
}

// confirmStart is what became of a job handed to startConfirm.
type confirmStart int

const (
	confirmStarted   confirmStart = iota
	confirmCoalesced              // a job for the key is in flight: it settles this one too
	confirmDropped                // the provider's queue is full (or the store is closing)
)

// confirmations counts confirmation jobs by provider and outcome
// (started, coalesced, dropped).
var confirmations = prometheus.NewCounterVec(prometheus.CounterOpts{
	Namespace: "caddy", Subsystem: "pingback", Name: "confirmations_total",
	Help: "Confirmations with the provider (res_php, conflicts), by provider and outcome: started, coalesced (one for the id already in flight), dropped (the provider's queue of confirmation_queue jobs full).",
}, []string{"provider", "outcome"})

// confirmDropLog throttles the warn lines of dropped confirmations.
var confirmDropLog = newThrottledLog(20, 100, "confirmations dropped in the last minute (queue full)")

// take reserves a job for key; it reports why not if it cannot.
func (q *confirmQueue) take(key store.Key) confirmStart {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.inFlight == nil {
		q.inFlight, q.jobs = map[store.Key]bool{}, map[string]int{}
	}
	switch {
	case q.inFlight[key]:
		return confirmCoalesced
	case q.jobs[key.Provider] >= confirmQueueSize:
		return confirmDropped
	}
	q.inFlight[key] = true
	q.jobs[key.Provider]++
	return confirmStarted
}

// done releases key's job.
func (q *confirmQueue) done(key store.Key) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.inFlight, key)
	q.jobs[key.Provider]--
}

// pending is how many jobs provider has (tests).
func (q *confirmQueue) pending(provider string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.jobs[provider]
}

// startConfirm runs fn, a confirmation or settlement of key, in the
// background within the bounds above, and says what became of it.
func (a *App) startConfirm(key store.Key, logger *zap.Logger, fn func(ctx context.Context, st store.Store)) confirmStart {
	h := a.readyHandle()
	if h == nil {
		return confirmDropped
	}
	got := h.confirms.take(key)
	if got == confirmStarted && !a.startBackground(func(ctx context.Context, st store.Store) {
		defer h.confirms.done(key)
		fn(ctx, st)
	}) {
		h.confirms.done(key)
		got = confirmDropped
	}
	switch got {
	case confirmStarted:
		confirmations.WithLabelValues(key.Provider, "started").Inc()
	case confirmCoalesced:
		confirmations.WithLabelValues(key.Provider, "coalesced").Inc()
	case confirmDropped:
		confirmations.WithLabelValues(key.Provider, "dropped").Inc()
		if confirmDropLog.allow(key.Provider) {
			logger.Warn("confirmation with the provider dropped: too many in flight for this provider (a flood of pingbacks?); the result is not confirmed now",
				zap.String("key", key.String()), zap.Int("queue", confirmQueueSize))
		}
	}
	return got
}

// overPollBudget reports whether polls result requests for tracked tasks
// spent the in-process res.php budget (10 per task plus pollAllowance).
func overPollBudget(polls, tracked int) bool { return polls >= 10*tracked+pollAllowance }

// overBudget reports whether the provider's in-process res.php budget,
// shared by the poller and the confirmations, is spent.
func (ps *providerState) overBudget() bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return overPollBudget(ps.polls, ps.tracked)
}
