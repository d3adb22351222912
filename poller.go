package pingback

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/caddy-pingback/pingback/internal/drill"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/providerclient"
	"github.com/caddy-pingback/pingback/internal/store"
)

// providerState is the poller's process-wide state for one provider, kept
// in the pooled store handle so it survives config reloads: what is the
// provider's, whatever account asks (accountState holds each account's).
type providerState struct {
	latencies latencies

	mu sync.Mutex
	// The shared "after" estimate (a store shared by instances) and when
	// it was read.
	sharedAfter   time.Duration
	sharedAfterAt time.Time
}

// provider returns the state of the named provider, creating it.
func (h *storeHandle) provider(name string) *providerState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.providers == nil {
		h.providers = make(map[string]*providerState)
	}
	ps := h.providers[name]
	if ps == nil {
		ps = new(providerState)
		h.providers[name] = ps
	}
	return ps
}

// pollLoop polls overdue tasks while this app owns the store's loops.
func (a *App) pollLoop() {
	defer close(a.pollDone)
	defer func() {
		if err := recover(); err != nil {
			a.logger.Error("poll loop panicked", zap.Any("error", err), zap.ByteString("stack", debug.Stack()))
		}
	}()
	t := time.NewTicker(pollTick())
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		if a.handle.owns(a) {
			a.pollDue()
			a.loopRan("poll")
		}
	}
}

// pollDue polls the tasks that are due now, account by account: only the
// tasks of accounts this Caddy has a key for (on a shared store, another
// instance polls its own), each with its own key. Tasks of other accounts
// are not polled; they expire at give_up (expireOverdue).
func (a *App) pollDue() {
	st := a.handle.store
	if !st.Available() {
		return // a full disk: no res.php request whose result could not be stored
	}
	now := a.now().UTC()
	a.expireOverdue(now)
	accounts := a.pollAccounts()
	if len(accounts) == 0 {
		return
	}
	tasks, err := st.DueTasks(a.ctx, store.DueQuery{Now: now, Limit: 1000, Accounts: accounts})
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			a.logger.Error("scanning pending tasks", zap.Error(err))
		}
		return
	}
	byAccount := map[store.Account][]*store.Task{}
	for _, t := range tasks {
		if !now.Before(t.SubmittedAt.Add(a.providerConfig(t.Provider).giveUp)) {
			a.expireTask(t, "no result within give_up")
			continue
		}
		acct := store.Account{Provider: t.Provider, ID: t.Account}
		byAccount[acct] = append(byAccount[acct], t)
	}
	for acct, ts := range byAccount {
		if acc, ok := a.providerConfig(acct.Provider).taskAccount(acct.ID); ok {
			a.pollAccount(acct.Provider, acc, ts, now)
		}
	}
}

// pollAccounts returns every account the poller polls for: each
// configured key of each provider, and, for a provider with a key, the
// tasks stored without account (taskAccount: polled with its first key).
func (a *App) pollAccounts() []store.Account {
	var out []store.Account
	for _, name := range protocol.Names() {
		if pc := a.Providers[name]; pc != nil && len(pc.accounts) > 0 {
			out = append(out, store.Account{Provider: name})
			for _, acc := range pc.accounts {
				out = append(out, store.Account{Provider: name, ID: acc.id})
			}
		}
	}
	return out
}

// pollAccount asks one provider, with one account's key, for the results
// of the account's due tasks: tokens in bulk, the rest one by one, within
// the account's rate limit and budget.
func (a *App) pollAccount(name string, acc account, tasks []*store.Task, now time.Time) {
	acct := store.Account{Provider: name, ID: acc.id}
	as := a.handle.account(acct)
	pc := a.providerConfig(name)
	as.limiter.SetLimit(rate.Limit(a.Poll.Rate))
	as.limiter.SetBurst(max(1, int(math.Ceil(a.Poll.Rate))))

	as.mu.Lock()
	blockedUntil := as.blockedUntil
	blocked := now.Before(blockedUntil)
	stopped := as.stopped
	polls, tracked := as.polls, as.tracked
	// A shared store counts the budget of every instance (takePoll).
	overBudget := a.handle.sharedPolling() == nil && overPollBudget(polls, tracked)
	logBudget := overBudget && !as.budgetLogged
	as.budgetLogged = as.budgetLogged || overBudget
	as.mu.Unlock()

	if logBudget {
		a.logger.Warn("res.php budget reached: polling slowed to stay well under the provider's 20 requests per task",
			zap.String("provider", name), zap.String("account", acc.id), zap.Int("polls", polls), zap.Int("tasks", tracked))
		a.noteAccountEvent(EventAccountOutOfBudget, acct)
	}
	if stopped || overBudget {
		// Nothing to do now; look again next interval, not every tick.
		for _, t := range tasks {
			a.reschedule(t, now.Add(time.Duration(a.Poll.Interval)), false)
		}
		return
	}
	if blocked {
		// Due again when the block ends: out of the scan meanwhile, so
		// that other accounts' tasks are not starved behind them.
		for _, t := range tasks {
			a.reschedule(t, blockedUntil, false)
		}
		return
	}

	var bulk, single, jsonTasks []*store.Task
	for _, t := range tasks {
		if t.API == string(protocol.JSON) {
			jsonTasks = append(jsonTasks, t)
		} else if protocol.TokenMethods[t.Method] {
			bulk = append(bulk, t)
		} else {
			single = append(single, t)
		}
	}
	var groups [][]*store.Task
	for len(bulk) > 0 {
		n := min(len(bulk), a.Poll.Batch)
		groups = append(groups, bulk[:n])
		bulk = bulk[n:]
	}
	for _, t := range single {
		groups = append(groups, []*store.Task{t})
	}
	client := &providerclient.ResPHP{Endpoint: pc.endpoint, Key: acc.key, Method: pc.resMethod, HTTP: a.httpClient}
	for _, g := range groups {
		// A newer config took over the store's loops (reload): leave the
		// rest of the round to it.
		if !a.handle.owns(a) || !a.pollGroup(acct, as, client, g, now) {
			return
		}
	}
	a.pollJSONTasks(acct, as, acc, jsonTasks, now)
}

// pollGroup asks res.php once for the tasks of g and acts on the answers.
// It reports whether polling this provider may go on in this round.
func (a *App) pollGroup(acct store.Account, as *accountState, c *providerclient.ResPHP, g []*store.Task, now time.Time) bool {
	name := acct.Provider
	if ok, _, _ := a.takePoll(acct, as); !ok {
		return false
	}
	claimed := g[:0:0]
	for _, t := range g {
		if ct := a.reschedule(t, now.Add(time.Duration(a.Poll.Interval)), true); ct != nil {
			claimed = append(claimed, ct)
		}
	}
	if len(claimed) == 0 {
		return true
	}
	ids := make([]string, len(claimed))
	for i, t := range claimed {
		ids[i] = t.ID
	}
	as.countPoll()

	// Not cut short by Stop (a reload would then ask again): Stop waits
	// for at most one request in flight.
	ctx, cancel := context.WithTimeout(a.ctx, resTimeout)
	answers, err := c.Get(ctx, ids)
	cancel()
	if err != nil {
		a.metrics.resphp.WithLabelValues(name, "error").Inc()
		a.backoffAccount(acct, as, now, protocol.Answer{Kind: protocol.Backoff, Code: err.Error()})
		return false
	}
	if len(answers) != len(claimed) {
		if len(answers) == 1 && (answers[0].Kind == protocol.Backoff || answers[0].Kind == protocol.KeyError) {
			return a.onAnswer(acct, as, nil, answers[0], now)
		}
		// Never guess which element belongs to which id: ask one by one.
		a.metrics.resphp.WithLabelValues(name, "bulk_mismatch").Inc()
		a.logger.Debug("bulk answer count mismatch; asking one by one",
			zap.String("provider", name), zap.Int("asked", len(claimed)), zap.Int("got", len(answers)))
		for _, t := range claimed {
			if !a.pollSingleNow(acct, as, c, t, now) {
				return false
			}
		}
		return true
	}
	a.metrics.resphp.WithLabelValues(name, "ok").Inc()
	for i, ans := range answers {
		if !a.onAnswer(acct, as, claimed[i], ans, now) {
			return false
		}
	}
	return true
}

// pollSingleNow asks res.php for one already claimed task (the bulk
// fallback), waiting for the rate limiter.
func (a *App) pollSingleNow(acct store.Account, as *accountState, c *providerclient.ResPHP, t *store.Task, now time.Time) bool {
	name := acct.Provider
	if !a.waitPoll(acct, as) {
		return false
	}
	as.countPoll()
	_, _ = a.handle.store.UpdateTask(a.ctx, t.Key(), func(t *store.Task) error { t.Polls++; return nil })
	ctx, cancel := context.WithTimeout(a.ctx, resTimeout)
	answers, err := c.Get(ctx, []string{t.ID})
	cancel()
	if err != nil || len(answers) != 1 {
		a.metrics.resphp.WithLabelValues(name, "error").Inc()
		text := "unexpected answer"
		if err != nil {
			text = err.Error()
		}
		a.backoffAccount(acct, as, now, protocol.Answer{Kind: protocol.Backoff, Code: text})
		return false
	}
	a.metrics.resphp.WithLabelValues(name, "ok").Inc()
	return a.onAnswer(acct, as, t, answers[0], now)
}

// onAnswer acts on one answer for task t (nil for an answer about the
// account), asked with acct's key.
func (a *App) onAnswer(acct store.Account, as *accountState, t *store.Task, ans protocol.Answer, now time.Time) bool {
	switch ans.Kind {
	case protocol.Result, protocol.TaskError:
		as.ok()
		a.deliverPolled(t, ans)
	case protocol.NotReady:
		as.ok() // rescheduled when claimed
	case protocol.UnknownTask:
		as.ok()
		a.expireTask(t, "provider does not know the task: "+ans.Code)
	case protocol.KeyError:
		if as.setOnce(&as.stopped) {
			a.logger.Error("provider rejected the API key: polling stopped for this account (its other accounts go on)",
				zap.String("provider", acct.Provider), zap.String("account", acct.ID), zap.String("answer", ans.Code))
			a.noteAccountEvent(EventAPIKeyRejected, acct)
		}
		return false
	case protocol.Backoff:
		a.backoffAccount(acct, as, now, ans)
		return false
	}
	return true
}

// backoffAccount blocks polling with the account's key: exponentially
// longer with consecutive failures (5s doubling up to 10m), at least the
// block the answer documents, with full jitter on top of that floor. The
// provider's other accounts are not blocked.
func (a *App) backoffAccount(acct store.Account, as *accountState, now time.Time, ans protocol.Answer) {
	as.mu.Lock()
	as.failures++
	floor := providerBackoffFloor() // 5s; scaled only in the drill's child
	capd := min(floor<<min(as.failures-1, 7), 10*time.Minute)
	wait := max(ans.Wait, floor) + time.Duration(a.jitter(int64(capd)+1))
	as.blockedUntil = now.Add(wait)
	n := as.failures
	as.mu.Unlock()
	a.logger.Warn("provider unavailable for polling with this account; backing off",
		zap.String("provider", acct.Provider), zap.String("account", acct.ID), zap.String("answer", truncate(ans.Code, 120)),
		zap.Int("consecutive", n), zap.Duration("wait", wait))
}

// truncate cuts s to its first n bytes and marks the cut with "…", for
// logging a provider's answer.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// reschedule moves a pending task's next poll to next; with claim, it also
// counts the poll about to be made. It returns the updated task, or nil if
// the task is no longer pending.
func (a *App) reschedule(t *store.Task, next time.Time, claim bool) *store.Task {
	now := a.now().UTC()
	scanned := t.NextPollAt
	ut, err := a.handle.store.UpdateTask(a.ctx, t.Key(), func(t *store.Task) error {
		// A claim fails if another poll loop (the overlapping config of a
		// reload) claimed the task since the scan: never ask twice.
		if t.State != store.TaskPending || (claim && !t.NextPollAt.Equal(scanned)) {
			return store.ErrSkip
		}
		t.NextPollAt = next
		t.UpdatedAt = now
		if claim {
			t.Polls++
		}
		return nil
	})
	if err != nil {
		if !errors.Is(err, store.ErrSkip) {
			a.logger.Error("rescheduling a task", zap.String("key", t.Key().String()), zap.Error(err))
		}
		return nil
	}
	return ut
}

// expireTask marks a task expired: it is never polled again.
func (a *App) expireTask(t *store.Task, why string) {
	now := a.now().UTC()
	_, err := a.handle.store.UpdateTask(a.ctx, t.Key(), func(t *store.Task) error {
		if t.State != store.TaskPending {
			return store.ErrSkip
		}
		t.State, t.NextPollAt, t.LastError, t.UpdatedAt = store.TaskExpired, time.Time{}, why, now
		return nil
	})
	switch {
	case errors.Is(err, store.ErrSkip):
	case err != nil:
		a.logger.Error("expiring a task", zap.String("key", t.Key().String()), zap.Error(err))
	default:
		a.metrics.tasks.WithLabelValues(t.Provider, "expired").Inc()
		a.logger.Info("task expired without a result", zap.String("key", t.Key().String()), zap.String("reason", why))
	}
}

// deliverPolled stores a polled result like a pingback (durable, deduplicated:
// if the pingback was stored first this is a duplicate and stops here),
// queued for its first forward, and wakes the replay loop, which delivers it
// to the task's pingback URL in-process, in the provider's pingback format,
// with X-Pingback-Source: poll, as soon as a forward slot is free.
func (a *App) deliverPolled(t *store.Task, ans protocol.Answer) {
	now := a.now().UTC()
	rec, err := a.polledRecord(t, ans, now)
	if err != nil {
		a.logger.Error("cannot deliver polled result", zap.String("key", t.Key().String()), zap.Error(err))
		a.expireTask(t, err.Error())
		return
	}
	// Not loopCtx: a result fetched while the config stops is stored all
	// the same (else it would cost another request to the provider).
	res, err := a.handle.store.Insert(context.Background(), rec)
	switch {
	case err != nil:
		// The task stays pending: polled again next interval.
		a.logger.Error("storing polled result failed; will poll again", zap.String("key", t.Key().String()), zap.Error(err))
		return
	case res.Existing != nil:
		a.polledExisting(t, ans, res.Existing, rec)
		return
	}
	a.countReceived(t.Provider, "poll_stored")
	a.metrics.tasks.WithLabelValues(t.Provider, "recovered").Inc()
	a.logger.Info("result recovered by polling", zap.String("key", t.Key().String()))
	a.handle.wake()
}

// polledRecord builds the record of a polled result: the request is the
// pingback the provider would have sent to the task's pingback URL, in the
// provider's callback format:
//   - an in.php task: GET with id and code appended to the URL's own query,
//     kept exactly as given (callback_method get), or POST form id=&code=
//     (callback_method post); extra members of a res.php JSON answer
//     (Turnstile's useragent) follow as fields of the same names;
//   - a createTask task: POST application/json, the getTaskResult answer
//     with taskId (callback_format json), or POST form id and code, the
//     solution's token (callback_format form).
//
// The record keeps code and the provider's whole answer.
func (a *App) polledRecord(t *store.Task, ans protocol.Answer, now time.Time) (*store.Record, error) {
	u, err := url.Parse(t.PingbackURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("task pingback URL %q is not an absolute URL", t.PingbackURL)
	}
	srv := t.Server
	if srv == "" { // tracked before tasks named their server
		if srv, err = a.serverForURL(context.Background(), u, a.callbackMethodFor(t.Provider, protocol.API(t.API))); err != nil {
			return nil, err
		}
	}
	pc := a.providerConfig(t.Provider)
	prov, _ := lookupProvider(t.Provider)
	req := store.Request{
		Method:     http.MethodPost,
		Host:       u.Host,
		Proto:      "HTTP/1.1",
		RemoteAddr: "127.0.0.1:0",
		LocalAddr:  ":" + strconv.FormatUint(uint64(urlPort(u)), 10),
		TLS:        u.Scheme == "https",
		Header:     http.Header{"User-Agent": {"caddy-pingback poller"}},
	}
	uri := u.EscapedPath()
	if uri == "" {
		uri = "/"
	}
	req.URI = uri
	if u.RawQuery != "" {
		req.URI += "?" + u.RawQuery
	}
	switch {
	case t.API == string(protocol.JSON) && pc.format == protocol.JSONPOST:
		req.Body = prov.JSONCallbackBody(t.ID, ans.Raw)
		if req.Body == nil {
			return nil, fmt.Errorf("the provider's answer for task %s is not a JSON object", t.ID)
		}
		req.Header.Set("Content-Type", "application/json")
	case t.API == string(protocol.JSON):
		code := ans.Code
		if ans.Kind == protocol.Result {
			code = protocol.FormCode(protocol.Solution(ans.Raw))
		}
		req.Body = protocol.LegacyCallbackForm(t.ID, code, nil)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	case pc.method == http.MethodGet:
		req.Method = http.MethodGet
		req.URI = uri + "?" + protocol.LegacyCallbackQuery(u.RawQuery, t.ID, ans.Code, protocol.ExtraFields(ans.Raw))
	default:
		req.Body = protocol.LegacyCallbackForm(t.ID, ans.Code, protocol.ExtraFields(ans.Raw))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return &store.Record{
		Provider:   t.Provider,
		ID:         t.ID,
		Code:       ans.Code,
		Answer:     ans.Raw,
		Source:     store.SourcePoll,
		ReceivedAt: now,
		Server:     srv,
		Request:    req,
		Delivery:   store.Delivery{State: store.StateQueued, DueAt: now, UpdatedAt: now},
		ExpiresAt:  now.Add(time.Duration(a.Retention)),
		// Read from the provider's result API: the provider's own answer.
		Verified: VerifyResPHP,
		Tracked:  true,
	}, nil
}

// callbackMethodFor is the HTTP method polled results of a task of the
// provider and API family are delivered with (for the pingback URL probe).
func (a *App) callbackMethodFor(provider string, api protocol.API) string {
	if api == protocol.JSON {
		return http.MethodPost
	}
	return a.providerConfig(provider).method
}

// polledExisting settles a polled result whose key already holds a
// record. The polled answer is the provider's own: a quarantined record
// is superseded by it (delivered, the quarantined code kept as
// other_code); a record with another code is corrected (delivered again
// as a correction if the app had the wrong one); either way the task is
// done, since the result is now known. The same code is a duplicate.
func (a *App) polledExisting(t *store.Task, ans protocol.Answer, existing, rec *store.Record) {
	st := a.handle.store
	ctx := context.Background()
	switch {
	case existing.State == store.StateQuarantined:
		if _, err := a.supersede(ctx, st, t.Key(), rec); err != nil {
			if !errors.Is(err, store.ErrSkip) {
				a.logger.Error("storing polled result over a quarantined one failed; will poll again", zap.String("key", t.Key().String()), zap.Error(err))
			}
			return
		}
		a.countReceived(t.Provider, "poll_stored")
		a.logger.Info("result recovered by polling; a quarantined pingback of it is kept as other_code", zap.String("key", t.Key().String()))
		a.handle.wake()
		return
	case !sameResult(existing.Code, ans) && !existing.PayloadErased:
		a.correct(ctx, st, t, ans, true, a.logger)
	default:
		a.countReceived(t.Provider, "poll_duplicate")
	}
	a.finishTask(t, existing.ReceivedAt)
}

// finishTask marks a pending task done: its result is known.
func (a *App) finishTask(t *store.Task, resultAt time.Time) {
	now := a.now().UTC()
	_, err := a.handle.store.UpdateTask(context.Background(), t.Key(), func(t *store.Task) error {
		if t.State != store.TaskPending {
			return store.ErrSkip
		}
		t.State, t.NextPollAt, t.UpdatedAt, t.ResultAt = store.TaskDone, time.Time{}, now, resultAt
		return nil
	})
	if err != nil && !errors.Is(err, store.ErrSkip) {
		a.logger.Warn("marking a task done failed; it is polled again", zap.String("key", t.Key().String()), zap.Error(err))
	}
}

// pollJSONTasks asks getTaskResult, with the account's key, for each of
// its due createTask tasks, one task per request, within the account's
// rate limit and budget (takePoll, as
// res.php: the store's if it is shared), honouring the provider's per-task
// limits: at most MaxResultCalls calls per task counting the app's own
// passed-through calls (CapMonster: 120), and no poll of a task the app
// polled itself within the last interval (its answer, passed through
// pingback_track, gives the plugin the result anyway).
func (a *App) pollJSONTasks(acct store.Account, as *accountState, acc account, tasks []*store.Task, now time.Time) {
	if len(tasks) == 0 {
		return
	}
	name := acct.Provider
	pc := a.providerConfig(name)
	prov, _ := lookupProvider(name)
	if pc.apiEndpoint == "" {
		for _, t := range tasks {
			a.expireTask(t, "the provider has no JSON API the plugin can poll")
		}
		return
	}
	client := &providerclient.TaskResult{Provider: prov, Endpoint: pc.apiEndpoint, Key: acc.key, HTTP: a.httpClient}
	interval := time.Duration(a.Poll.Interval)
	for _, t := range tasks {
		if !a.handle.owns(a) {
			return
		}
		if prov.MaxResultCalls > 0 && t.Polls+t.AppPolls >= prov.MaxResultCalls {
			a.logger.Warn("task reached the provider's limit of result calls; not polled again",
				zap.String("key", t.Key().String()), zap.Int("limit", prov.MaxResultCalls),
				zap.Int("polls", t.Polls), zap.Int("app_polls", t.AppPolls))
			a.expireTask(t, "the provider's limit of getTaskResult calls per task was reached")
			continue
		}
		if !t.AppPolledAt.IsZero() && now.Sub(t.AppPolledAt) < interval {
			a.reschedule(t, t.AppPolledAt.Add(interval), false)
			continue
		}
		// The same rate and budget as res.php (shared by every instance
		// when the store is: two instances never poll twice as hard).
		if ok, _, _ := a.takePoll(acct, as); !ok {
			return
		}
		ct := a.reschedule(t, now.Add(max(interval, prov.MinResultGap)), true)
		if ct == nil {
			continue
		}
		as.countPoll()
		ctx, cancel := context.WithTimeout(a.ctx, resTimeout)
		ans, err := client.Get(ctx, ct.ID)
		cancel()
		if err != nil {
			a.metrics.resphp.WithLabelValues(name, "error").Inc()
			a.backoffAccount(acct, as, now, protocol.Answer{Kind: protocol.Backoff, Code: err.Error()})
			return
		}
		a.metrics.resphp.WithLabelValues(name, "ok").Inc()
		if !a.onAnswer(acct, as, ct, ans, now) {
			return
		}
	}
}

// drillScaleEnv is the environment variable through which `caddy pingback
// drill` tells the child Caddy it starts that the config's timers were
// scaled down by this factor (a number in (0, 1)). Only that child honours
// it, for the drill's sandbox config: it lowers the validated minimums and
// the plugin's fixed timers (the poll loop's tick, the automatic "after"
// bounds, the provider back-off floor) by the same factor, so a scaled
// config still validates. A config alone can never lower a minimum.
const drillScaleEnv = drill.ScaleEnv

// drillTimerScale returns the timer scale of the drill's child, or 1.
func drillTimerScale() float64 {
	v := os.Getenv(drillScaleEnv)
	if v == "" {
		return 1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0 && f < 1) {
		return 1
	}
	return f
}

// drillScaled scales d by the drill's timer scale, never below floor (nor
// above d).
func drillScaled(d, floor time.Duration) time.Duration {
	return drill.Scaled(drillTimerScale(), d, floor)
}

// Timers of the plugin as the drill's child scales them; each is the
// plain constant outside the drill.
func minPollInterval() time.Duration { return drillScaled(MinPollInterval, 50*time.Millisecond) }

func autoAfterLow() time.Duration { return drillScaled(autoAfterMin, 100*time.Millisecond) }

func autoAfterHigh() time.Duration { return drillScaled(autoAfterMax, 100*time.Millisecond) }

func pollTick() time.Duration { return drillScaled(time.Second, 100*time.Millisecond) }

func providerBackoffFloor() time.Duration { return drillScaled(5*time.Second, time.Second) }
