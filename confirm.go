package pingback

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/providerclient"
	"github.com/caddy-pingback/pingback/internal/store"
)

// errNotConfirmed is the answer of askResult when the provider gave no
// final answer (not ready, an error, the budget spent).
var errNotConfirmed = errors.New("the provider gave no final answer")

// errBudgetSpent is askResult's answer when the res.php budget is spent
// (or the loops stop): asking again would not help.
var errBudgetSpent = fmt.Errorf("%w: the result request budget is spent", errNotConfirmed)

// errContradicted stops a confirmation's update when the record's code is
// not the provider's answer.
var errContradicted = errors.New("the provider's answer differs from the pingback's code")

// askResult asks the provider once for task's result, as the poller does.
//
// Confirmation with the provider (verify res_php, tasks without a token,
// and conflicts in any mode): one result request (res.php or
// getTaskResult) through the poller's clients, within its rate limit and
// res.php budget; a "not ready" answer is asked again confirmTries times
// confirmGap apart. It runs in the background: the provider's pingback is
// answered 200 once the record is durably stored, and the record is then
// delivered, or not, through the replay loop (the one delivery path).
func (a *App) askResult(ctx context.Context, t *store.Task) (protocol.Answer, error) {
	accs, err := a.confirmAccounts(t)
	if err != nil {
		return protocol.Answer{}, err
	}
	var ans protocol.Answer
	var failed error
	for _, acc := range accs {
		ans, err = a.askResultWith(ctx, t, acc)
		switch {
		case err == nil && ans.Kind == protocol.UnknownTask:
			// Not this account's task (an untracked result): the next key.
		case err != nil && len(accs) > 1:
			failed = err // this key could not ask (budget, back-off, error): the next one may
		default:
			return ans, err
		}
	}
	if failed != nil {
		return protocol.Answer{}, failed
	}
	return ans, errUnknownToAll
}

// errUnknownToAll: no configured account knows the untracked result's
// task; asking again will not change that.
var errUnknownToAll = errors.New("no configured api_key's account knows the task")

// errUnpollable: the task was submitted with an API key this Caddy does
// not have; the provider cannot be asked about it.
var errUnpollable = errors.New("the task's API key is not in the provider's api_key: it cannot be asked for")

// confirmAccounts returns the accounts to ask for task t's result: the
// task's own account; for a result with no tracked task (untrackedTask:
// State empty), every configured key in order.
func (a *App) confirmAccounts(t *store.Task) ([]account, error) {
	pc := a.providerConfig(t.Provider)
	if len(pc.accounts) == 0 {
		return nil, fmt.Errorf("no api_key configured for %s", t.Provider)
	}
	if t.State == "" {
		return pc.accounts, nil
	}
	acc, ok := pc.taskAccount(t.Account)
	if !ok {
		return nil, errUnpollable
	}
	return []account{acc}, nil
}

// askResultWith asks once, with acc's key, for task t's result.
func (a *App) askResultWith(ctx context.Context, t *store.Task, acc account) (protocol.Answer, error) {
	name := t.Provider
	h := a.readyHandle()
	if h == nil {
		return protocol.Answer{}, errStoreUnavailable
	}
	acct := store.Account{Provider: name, ID: acc.id}
	as := h.account(acct)
	pc := a.providerConfig(name)
	if held := as.held(a.now()); held != nil {
		return protocol.Answer{}, held
	}
	if a.handle.sharedPolling() == nil && as.overBudget() {
		// The in-process budget (a shared store's is checked by waitPoll).
		return protocol.Answer{}, errBudgetSpent
	}
	if !a.waitPoll(acct, as) {
		return protocol.Answer{}, errBudgetSpent
	}
	as.countPoll()
	if t.State != "" {
		_, _ = h.store.UpdateTask(ctx, t.Key(), func(t *store.Task) error { t.Polls++; return nil })
	}
	rctx, cancel := context.WithTimeout(ctx, resTimeout)
	defer cancel()
	var ans protocol.Answer
	var err error
	if t.API == string(protocol.JSON) {
		prov, _ := lookupProvider(name)
		c := &providerclient.TaskResult{Provider: prov, Endpoint: pc.apiEndpoint, Key: acc.key, HTTP: a.httpClient}
		ans, err = c.Get(rctx, t.ID)
	} else {
		c := &providerclient.ResPHP{Endpoint: pc.endpoint, Key: acc.key, HTTP: a.httpClient}
		var answers []protocol.Answer
		if answers, err = c.Get(rctx, []string{t.ID}); err == nil && len(answers) != 1 {
			err = errors.New("unexpected answer")
		}
		if err == nil {
			ans = answers[0]
		}
	}
	if err != nil {
		a.metrics.resphp.WithLabelValues(name, "error").Inc()
		return protocol.Answer{}, err
	}
	a.metrics.resphp.WithLabelValues(name, "ok").Inc()
	if ans.Kind == protocol.UnknownTask && t.State == "" {
		return ans, nil // askResult tries the next key
	}
	if !ans.Final() {
		return ans, errNotConfirmed
	}
	return ans, nil
}

// askUntilFinal asks for task's result until the answer is final, at most
// 1 + confirmTries times, confirmGap apart.
func (a *App) askUntilFinal(ctx context.Context, t *store.Task) (protocol.Answer, error) {
	for try := 0; ; try++ {
		ans, err := a.askResult(ctx, t)
		if err == nil {
			return ans, nil
		}
		if try >= confirmTries || errors.Is(err, errBudgetSpent) || errors.Is(err, errUnpollable) || errors.Is(err, errUnknownToAll) ||
			errors.Is(err, errAccountHeld) || !a.confirmAfter(ctx, confirmGap) {
			return ans, err
		}
	}
}

// sameResult reports whether a stored code and a provider's answer are
// the same result: the same text, the same JSON once normalised
// (canonical JSON), or, for a createTask task whose pingback came as the
// form id/code, the solution's token.
func sameResult(code string, ans protocol.Answer) bool {
	if code == ans.Code {
		return true
	}
	if a, err := protocol.CanonicalJSON([]byte(code)); err == nil {
		if b, err := protocol.CanonicalJSON([]byte(ans.Code)); err == nil && a == b {
			return true
		}
	}
	return ans.Kind == protocol.Result && ans.Raw != nil && protocol.Solution(ans.Raw) != nil &&
		code == protocol.FormCode(protocol.Solution(ans.Raw))
}

// startBackground runs fn in the background, counted by the store handle
// so that closing the store waits for it; false if the store is closing.
func (a *App) startBackground(fn func(ctx context.Context, st store.Store)) bool {
	h := a.readyHandle()
	if h == nil || !h.track() {
		return false
	}
	go func() {
		defer h.untrack()
		fn(a.loopCtx, h.store)
	}()
	return true
}

// confirmStored confirms a record stored for confirmation (quarantined
// "confirming") with the provider: the same result is queued for delivery
// (X-Pingback-Verified: res_php); another one delivers the provider's
// answer instead and keeps the pingback's code as other_code; no final
// answer leaves it quarantined ("not_confirmed"), and its task pending, so
// the poller still fetches the provider's answer, which then supersedes it.
func (a *App) confirmStored(ctx context.Context, st store.Store, key store.Key, logger *zap.Logger) {
	t, err := st.GetTask(ctx, key)
	if err != nil {
		logger.Warn("confirming a pingback: its task cannot be read; it stays quarantined", zap.String("key", key.String()), zap.Error(err))
		a.markQuarantined(ctx, st, key, whyNotConfirmed)
		return
	}
	ans, err := a.askUntilFinal(ctx, t)
	if err != nil {
		if ctx.Err() != nil {
			return // stopping: the task stays pending, and the poller settles it
		}
		logger.Warn("pingback not confirmed by the provider: quarantined (the poller still asks for the result)",
			zap.String("key", key.String()), zap.Error(err))
		a.countReceived(key.Provider, "quarantined")
		a.markQuarantined(ctx, st, key, whyNotConfirmed)
		return
	}
	now := a.now().UTC()
	// The answer is compared with the record as it is now, inside the
	// update: the record read before asking may have been replaced
	// meanwhile, and only the code the provider confirms is delivered.
	_, err = st.UpdateRecord(ctx, key, func(r *store.Record) error {
		if r.State != store.StateQuarantined || r.Quarantine != whyConfirming {
			return store.ErrSkip
		}
		if !sameResult(r.Code, ans) {
			return errContradicted
		}
		r.State, r.DueAt, r.UpdatedAt = store.StateQueued, now, now
		r.Verified, r.Quarantine = VerifyResPHP, ""
		return nil
	})
	if errors.Is(err, errContradicted) {
		a.countReceived(key.Provider, "quarantined")
		logger.Warn("pingback contradicted by the provider's own answer: the provider's answer is delivered, the pingback's code kept as other_code",
			zap.String("key", key.String()))
		var next *store.Record
		if next, err = a.polledRecord(t, ans, now); err == nil {
			next.Verified, next.Tracked, next.Quarantine = VerifyResPHP, true, whyProvider
			_, err = a.supersede(ctx, st, key, next)
		}
	}
	switch {
	case err == nil:
		a.quarantineChanged(st, key.Provider)
		a.handle.wake()
	case errors.Is(err, store.ErrSkip):
	default:
		logger.Error("recording a pingback's confirmation failed; it stays quarantined", zap.String("key", key.String()), zap.Error(err))
	}
}

// confirmLater confirms the record stored under key for confirmation in
// the background (startConfirm); if the job cannot start, the record is
// marked "not_confirmed" now (its task stays pending: the poller's answer
// supersedes it).
func (a *App) confirmLater(ctx context.Context, st store.Store, key store.Key, logger *zap.Logger) {
	if a.startConfirm(key, logger, func(ctx context.Context, st store.Store) {
		a.confirmStored(ctx, st, key, logger)
	}) == confirmDropped {
		a.markQuarantined(ctx, st, key, whyNotConfirmed)
	}
}

// markQuarantined sets the quarantine reason of a quarantined record.
func (a *App) markQuarantined(ctx context.Context, st store.Store, key store.Key, why string) {
	_, _ = st.UpdateRecord(ctx, key, func(r *store.Record) error {
		if r.State != store.StateQuarantined {
			return store.ErrSkip
		}
		r.Quarantine, r.UpdatedAt = why, a.now().UTC()
		return nil
	})
}

// settleConflict confirms with the provider which of two codes of one
// task is its result: the stored one, or code, which a later pingback
// carried. The provider's answer wins and both codes are kept; if the app
// had already been sent the losing code, the right one is delivered again
// as a correction. A result whose task the plugin does not track is
// confirmed all the same (res.php and getTaskResult need only the id and
// a key: each configured key is tried in order), its correction delivered
// to the URL its pingback came to (untrackedTask). Without an api_key, for
// a task of an account this Caddy has no key for, or if the provider gives
// no final answer, the first code is kept and the other recorded as
// other_code.
func (a *App) settleConflict(ctx context.Context, st store.Store, key store.Key, code string, logger *zap.Logger) {
	if len(a.providerConfig(key.Provider).accounts) == 0 {
		a.keepOtherCode(ctx, st, key, code)
		return
	}
	t, err := st.GetTask(ctx, key)
	tracked := err == nil
	if errors.Is(err, store.ErrNotFound) {
		t, err = a.untrackedTask(ctx, st, key)
	}
	if err == nil && tracked && !a.taskPollable(t) {
		err = errUnpollable // its account's key is not configured: nobody to ask
	}
	if err != nil {
		a.keepOtherCode(ctx, st, key, code)
		return
	}
	ans, err := a.askUntilFinal(ctx, t)
	if err != nil {
		if ctx.Err() == nil {
			logger.Warn("conflicting pingback not settled: the provider gave no final answer; the first code is kept",
				zap.String("key", key.String()), zap.Error(err))
			a.keepOtherCode(ctx, st, key, code)
		}
		return
	}
	if !a.correct(ctx, st, t, ans, tracked, logger) {
		a.keepOtherCode(ctx, st, key, code)
	}
}

// untrackedTask describes, for a result whose task the plugin does not
// track, what a result request and a correction need: the provider's API
// (the JSON one if the provider has no legacy API or the pingback was
// JSON, else the legacy one) and the URL the pingback came to (its token,
// if any, taken out), on the server that received it. Its State is empty
// (no tracked task): askResult asks with every configured key in turn.
func (a *App) untrackedTask(ctx context.Context, st store.Store, key store.Key) (*store.Task, error) {
	rec, err := st.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	prov, err := lookupProvider(key.Provider)
	if err != nil {
		return nil, err
	}
	api := ""
	if prov.LegacyEndpoint == "" || strings.HasPrefix(rec.Request.Header.Get("Content-Type"), "application/json") {
		api = string(protocol.JSON)
	}
	scheme := "http"
	if rec.Request.TLS {
		scheme = "https"
	}
	return &store.Task{
		Provider:    key.Provider,
		ID:          key.ID,
		API:         api,
		PingbackURL: scheme + "://" + rec.Request.Host + protocol.StripTokenURI(rec.Request.URI),
		Server:      rec.Server,
		SubmittedAt: rec.ReceivedAt,
	}, nil
}

// keepOtherCode records code as the record's other_code unless it is the
// record's own code.
func (a *App) keepOtherCode(ctx context.Context, st store.Store, key store.Key, code string) {
	_, _ = st.UpdateRecord(ctx, key, func(r *store.Record) error {
		if r.Code == code || r.OtherCode == code || r.PayloadErased {
			return store.ErrSkip
		}
		r.OtherCode = code
		return nil
	})
}

// correct makes the record of task t hold the provider's answer ans, the
// truth: if the stored code differs, it becomes other_code and the answer
// the code; an app that was already sent the wrong code (delivered, or
// being forwarded) gets the answer as a correction (X-Pingback-Source:
// correction, Idempotency-Key "<provider>:<id>:correction"); one that was
// not gets it as the result; tracked says whether t is a tracked task (a
// correction of an untracked result keeps X-Pingback-Tracked: false). It
// reports whether the record changed.
func (a *App) correct(ctx context.Context, st store.Store, t *store.Task, ans protocol.Answer, tracked bool, logger *zap.Logger) bool {
	now := a.now().UTC()
	next, err := a.polledRecord(t, ans, now)
	if err != nil {
		logger.Error("cannot build the provider's answer as a delivery; the stored code is kept", zap.String("key", t.Key().String()), zap.Error(err))
		return false
	}
	next.Verified, next.Tracked = VerifyResPHP, tracked
	corrected := false
	_, err = st.UpdateRecord(ctx, t.Key(), func(r *store.Record) error {
		if sameResult(r.Code, ans) || r.PayloadErased {
			return store.ErrSkip // erased: the app had it; no code to correct
		}
		sent := r.State == store.StateDelivered || r.State == store.StateForwarding || r.Correction
		other := r.Code
		quarantine := r.Quarantine
		attempts, history := r.Attempts, r.History
		*r = *next
		r.OtherCode, r.Quarantine = other, quarantine
		r.Correction = sent
		if sent {
			// The forwards of the wrong code stay counted and in the
			// history; the correction's are added after them.
			r.Attempts, r.History = attempts, history
		}
		corrected = sent
		return nil
	})
	switch {
	case err == nil:
		if corrected {
			logger.Warn("the app was sent a code the provider contradicts: delivering the provider's answer as a correction",
				zap.String("key", t.Key().String()))
		}
		a.countReceived(t.Provider, "corrected")
		a.handle.wake()
		return true
	case errors.Is(err, store.ErrSkip):
	default:
		logger.Error("storing a correction failed", zap.String("key", t.Key().String()), zap.Error(err))
	}
	return false
}

// confirmQueueSize is the most confirmation jobs per provider and store.
const confirmQueueSize = 32

// confirmQueue is one store's confirmation jobs: the keys in flight and
// how many jobs each provider has.
//
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
		if h.confirmsDropped.allow(key.Provider) {
			logger.Warn("confirmation with the provider dropped: too many in flight for this provider (a flood of pingbacks?); the result is not confirmed now",
				zap.String("key", key.String()), zap.Int("queue", confirmQueueSize))
		}
	}
	return got
}
