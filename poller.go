package pingback

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"golang.org/x/time/rate"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/providerclient"
	"github.com/caddy-pingback/pingback/internal/store"
)

// Defaults of the poll configuration.
const (
	DefaultPollInterval = 10 * time.Second
	MinPollInterval     = 5 * time.Second
	DefaultGiveUp       = 15 * time.Minute
	DefaultPollBatch    = 50
	DefaultPollRate     = 5.0

	// The poller's res.php budget per provider and process: at most 10
	// requests per task tracked since start plus pollAllowance, half of
	// 2captcha's rule R > 20·C + 1200 (ERROR: 1005,
	// https://2captcha.com/2captcha-api#limits), so the account stays well
	// under it.
	pollAllowance = 600

	// resTimeout bounds one res.php request.
	resTimeout = 15 * time.Second
)

// ProviderConfig is what the poller needs to ask one provider for results:
// res.php for tasks submitted with in.php, getTaskResult for tasks
// submitted with createTask.
type ProviderConfig struct {
	// Base URL of the provider's legacy in.php and res.php. Default per
	// provider: https://ocr.captchaai.com, https://2captcha.com,
	// https://rucaptcha.com; none for the JSON-only providers.
	Endpoint string `json:"endpoint,omitempty"`

	// Base URL of the provider's JSON API (createTask, getTaskResult).
	// Default per provider: https://api.2captcha.com,
	// https://api.rucaptcha.com, https://api.anti-captcha.com,
	// https://api.capmonster.cloud, https://api.capsolver.com; none for
	// captchaai.
	APIEndpoint string `json:"api_endpoint,omitempty"`

	// The account's API key, sent to res.php as key and to getTaskResult
	// as clientKey. Placeholders such as {env.CAPTCHAAI_KEY} are resolved
	// at provision; a key that is given but resolves empty fails the app's
	// start (not `caddy validate`). Required for polling; never logged.
	APIKey string `json:"api_key,omitempty"`

	// How polled results of in.php tasks are delivered to the pingback
	// URL, in the provider's own pingback format: "get" (query id, code)
	// or "post" (form id, code). Default: get for captchaai, post for
	// 2captcha and rucaptcha (docs/protocols.md).
	CallbackMethod string `json:"callback_method,omitempty"`

	// How polled results of createTask tasks are delivered to the
	// callback URL: "form" (POST form id, code) or "json" (POST the
	// getTaskResult answer with taskId). Default: form for 2captcha and
	// rucaptcha, json for anticaptcha, capmonster and capsolver.
	CallbackFormat string `json:"callback_format,omitempty"`

	// Time after submission at which this provider's tasks without a
	// result expire. The effective value is the smallest of this, the
	// global poll give_up and the provider's documented result retention
	// (capmonster: 5m; 15m for 2captcha, rucaptcha and captchaai).
	// Default: the global poll give_up.
	GiveUp caddy.Duration `json:"give_up,omitempty"`

	// How the poller sends its res.php requests: "post" (a form body, so
	// the API key is in no URL: not in the provider's or a proxy's access
	// logs, not in Go's transport errors) or "get" (the key in the query).
	// Default: post for 2captcha and rucaptcha (the 2captcha API v1
	// documentation shows res.php requests as POST bodies, and rucaptcha
	// serves the same API), get for captchaai (its documentation shows
	// only GET; whether it takes POST is not documented). getTaskResult is
	// always a JSON POST.
	ResultMethod string `json:"result_method,omitempty"`

	endpoint    string                  // resolved, without trailing slash
	apiEndpoint string                  // resolved, without trailing slash
	key         string                  // resolved
	keyErr      error                   // a key given that resolved empty: fails Start
	method      string                  // resolved, http.MethodGet or http.MethodPost
	resMethod   string                  // resolved result_method, http.MethodGet or http.MethodPost
	format      protocol.CallbackFormat // resolved, for createTask tasks
	giveUp      time.Duration           // effective
}

// PollConfig configures the fallback poller, which asks res.php for the
// results of tracked tasks whose pingback is overdue.
type PollConfig struct {
	// How long after submission a pingback counts as overdue. Zero or
	// absent means auto: 1.5 × the 95th percentile of the recently observed
	// submit-to-pingback delays, clamped to [20s, 120s] (120s until 20 delays
	// have been observed).
	After caddy.Duration `json:"after,omitempty"`

	// Time between two polls of one task. Default: 10s; never below 5s,
	// the least gap 2captcha and anti-captcha ask for
	// (https://2captcha.com/2captcha-api#solving_captchas,
	// https://anti-captcha.com/apidoc/methods/getTaskResult).
	Interval caddy.Duration `json:"interval,omitempty"`

	// Time after submission at which a task without a result is marked
	// expired and no longer polled; legacy providers forget results after
	// about 15 minutes (docs/protocols.md). It must be longer than the
	// first poll time (after; auto: 120s until delays are observed).
	// Per provider, the smaller of this and the provider's retention
	// applies (see ProviderConfig.GiveUp). Default: 15m.
	GiveUp caddy.Duration `json:"give_up,omitempty"`

	// Most task ids asked in one bulk request (res.php?ids=a,b,c); only
	// token-type methods (userrecaptcha, hcaptcha, turnstile) are asked in
	// bulk. Default: 50.
	Batch int `json:"batch,omitempty"`

	// Most res.php requests per second per provider. Default: 5.
	Rate float64 `json:"rate,omitempty"`
}

// provisionPolling sets the poller's defaults and resolves the providers.
func (a *App) provisionPolling() error {
	if a.Poll == nil {
		a.Poll = new(PollConfig)
	}
	p := a.Poll
	if p.Interval == 0 {
		p.Interval = caddy.Duration(DefaultPollInterval)
	}
	if p.GiveUp == 0 {
		p.GiveUp = caddy.Duration(DefaultGiveUp)
	}
	if p.Batch == 0 {
		p.Batch = DefaultPollBatch
	}
	if p.Rate == 0 {
		p.Rate = DefaultPollRate
	}
	for name, pc := range a.Providers {
		if pc == nil {
			pc = new(ProviderConfig)
			a.Providers[name] = pc
		}
		if err := pc.provision(name, time.Duration(p.GiveUp)); err != nil {
			return err
		}
	}
	return nil
}

// firstPoll is the longest time from submission to a task's first poll:
// after, or with auto the most it can be (autoAfterMax, what it is until
// delays are observed).
func (p *PollConfig) firstPoll() time.Duration {
	if p.After > 0 {
		return time.Duration(p.After)
	}
	return autoAfterHigh()
}

// validate checks the poll settings' ranges.
func (p *PollConfig) validate() error {
	switch {
	case time.Duration(p.Interval) < minPollInterval():
		return fmt.Errorf("poll interval must be at least %s, got %s", minPollInterval(), time.Duration(p.Interval))
	case p.After < 0:
		return fmt.Errorf("poll after must be positive, got %s", time.Duration(p.After))
	case time.Duration(p.GiveUp) <= p.firstPoll():
		return fmt.Errorf("poll give_up (%s) must be longer than the first poll time (%s): every task would expire unpolled", time.Duration(p.GiveUp), afterText(p))
	case p.Batch < 1:
		return fmt.Errorf("poll batch must be at least 1, got %d", p.Batch)
	case p.Rate <= 0 || p.Rate > 1000 || math.IsInf(p.Rate, 0) || math.IsNaN(p.Rate):
		return fmt.Errorf("poll rate must be a number of requests per second in (0, 1000], got %v", p.Rate)
	}
	return nil
}

// providerConfig returns the resolved configuration of a provider; a
// provider without a block gets the defaults (and no API key).
func (a *App) providerConfig(name string) *ProviderConfig {
	if pc := a.Providers[name]; pc != nil {
		return pc
	}
	pc := new(ProviderConfig)
	_ = pc.provision(name, time.Duration(a.Poll.GiveUp))
	return pc
}

// pollAfter is the overdue delay for a task of the provider.
func (a *App) pollAfter(provider string) time.Duration {
	if a.Poll.After > 0 {
		return time.Duration(a.Poll.After)
	}
	return a.autoAfter(provider)
}

// providerState is the poller's process-wide state for one provider, kept
// in the pooled store handle so it survives config reloads.
type providerState struct {
	latencies latencies
	limiter   *rate.Limiter

	mu           sync.Mutex
	blockedUntil time.Time
	failures     int    // consecutive backoff answers
	stoppedKey   string // the API key the provider rejected, if any
	noKeyLogged  bool
	polls        int // res.php requests since start
	tracked      int // tasks tracked since start
	budgetLogged bool

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
		ps = &providerState{limiter: rate.NewLimiter(rate.Limit(DefaultPollRate), int(DefaultPollRate))}
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

// pollDue polls the tasks that are due now, provider by provider.
func (a *App) pollDue() {
	st := a.handle.store
	if !st.Available() {
		return // a full disk: no res.php request whose result could not be stored
	}
	now := a.now().UTC()
	tasks, err := st.DueTasks(a.ctx, now, 1000)
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			a.logger.Error("scanning pending tasks", zap.Error(err))
		}
		return
	}
	byProvider := map[string][]*store.Task{}
	for _, t := range tasks {
		if !now.Before(t.SubmittedAt.Add(a.providerConfig(t.Provider).giveUp)) {
			a.expireTask(t, "no result within give_up")
			continue
		}
		byProvider[t.Provider] = append(byProvider[t.Provider], t)
	}
	for name, ts := range byProvider {
		a.pollProvider(name, ts, now)
	}
}

// pollProvider asks one provider for the results of its due tasks: tokens
// in bulk, the rest one by one, within the rate limit and the budget.
func (a *App) pollProvider(name string, tasks []*store.Task, now time.Time) {
	ps := a.handle.provider(name)
	pc := a.providerConfig(name)
	ps.limiter.SetLimit(rate.Limit(a.Poll.Rate))
	ps.limiter.SetBurst(max(1, int(math.Ceil(a.Poll.Rate))))

	ps.mu.Lock()
	blockedUntil := ps.blockedUntil
	blocked := now.Before(blockedUntil)
	stopped := pc.key != "" && ps.stoppedKey == pc.key
	noKey := pc.key == ""
	logNoKey := noKey && !ps.noKeyLogged
	ps.noKeyLogged = ps.noKeyLogged || noKey
	polls, tracked := ps.polls, ps.tracked
	// A shared store counts the budget of every instance (takePoll).
	overBudget := a.handle.sharedPolling() == nil && overPollBudget(polls, tracked)
	logBudget := overBudget && !ps.budgetLogged
	ps.budgetLogged = ps.budgetLogged || overBudget
	ps.mu.Unlock()

	if logNoKey {
		a.logger.Error("cannot poll: no api_key configured for the provider (global pingback option: provider <name> { api_key ... })",
			zap.String("provider", name))
	}
	if logBudget {
		a.logger.Warn("res.php budget reached: polling slowed to stay well under the provider's 20 requests per task",
			zap.String("provider", name), zap.Int("polls", polls), zap.Int("tasks", tracked))
	}
	if noKey || stopped || overBudget {
		// Nothing to do now; look again next interval, not every tick.
		for _, t := range tasks {
			a.reschedule(t, now.Add(time.Duration(a.Poll.Interval)), false)
		}
		return
	}
	if blocked {
		// Due again when the block ends: out of the scan meanwhile, so
		// that other providers' tasks are not starved behind them.
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
	client := &providerclient.ResPHP{Endpoint: pc.endpoint, Key: pc.key, Method: pc.resMethod, HTTP: a.httpClient}
	for _, g := range groups {
		// A newer config took over the store's loops (reload): leave the
		// rest of the round to it.
		if !a.handle.owns(a) || !a.pollGroup(name, ps, client, g, now) {
			return
		}
	}
	a.pollJSONTasks(name, ps, pc, jsonTasks, now)
}

// pollGroup asks res.php once for the tasks of g and acts on the answers.
// It reports whether polling this provider may go on in this round.
func (a *App) pollGroup(name string, ps *providerState, c *providerclient.ResPHP, g []*store.Task, now time.Time) bool {
	if ok, _, _ := a.takePoll(name, ps); !ok {
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
	ps.mu.Lock()
	ps.polls++
	ps.mu.Unlock()

	// Not cut short by Stop (a reload would then ask again): Stop waits
	// for at most one request in flight.
	ctx, cancel := context.WithTimeout(a.ctx, resTimeout)
	answers, err := c.Get(ctx, ids)
	cancel()
	if err != nil {
		a.metrics.resphp.WithLabelValues(name, "error").Inc()
		a.backoffProvider(name, ps, now, protocol.Answer{Kind: protocol.Backoff, Code: err.Error()})
		return false
	}
	if len(answers) != len(claimed) {
		if len(answers) == 1 && (answers[0].Kind == protocol.Backoff || answers[0].Kind == protocol.KeyError) {
			return a.onAnswer(name, ps, nil, answers[0], now)
		}
		// Never guess which element belongs to which id: ask one by one.
		a.metrics.resphp.WithLabelValues(name, "bulk_mismatch").Inc()
		a.logger.Debug("bulk answer count mismatch; asking one by one",
			zap.String("provider", name), zap.Int("asked", len(claimed)), zap.Int("got", len(answers)))
		for _, t := range claimed {
			if !a.pollSingleNow(name, ps, c, t, now) {
				return false
			}
		}
		return true
	}
	a.metrics.resphp.WithLabelValues(name, "ok").Inc()
	for i, ans := range answers {
		if !a.onAnswer(name, ps, claimed[i], ans, now) {
			return false
		}
	}
	return true
}

// pollSingleNow asks res.php for one already claimed task (the bulk
// fallback), waiting for the rate limiter.
func (a *App) pollSingleNow(name string, ps *providerState, c *providerclient.ResPHP, t *store.Task, now time.Time) bool {
	if !a.waitPoll(name, ps) {
		return false
	}
	ps.mu.Lock()
	ps.polls++
	ps.mu.Unlock()
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
		a.backoffProvider(name, ps, now, protocol.Answer{Kind: protocol.Backoff, Code: text})
		return false
	}
	a.metrics.resphp.WithLabelValues(name, "ok").Inc()
	return a.onAnswer(name, ps, t, answers[0], now)
}

// onAnswer acts on one answer for task t (nil for a provider-wide answer).
func (a *App) onAnswer(name string, ps *providerState, t *store.Task, ans protocol.Answer, now time.Time) bool {
	switch ans.Kind {
	case protocol.Result, protocol.TaskError:
		ps.ok()
		a.deliverPolled(t, ans)
	case protocol.NotReady:
		ps.ok() // rescheduled when claimed
	case protocol.UnknownTask:
		ps.ok()
		a.expireTask(t, "provider does not know the task: "+ans.Code)
	case protocol.KeyError:
		ps.mu.Lock()
		first := ps.stoppedKey != a.providerConfig(name).key
		ps.stoppedKey = a.providerConfig(name).key
		ps.mu.Unlock()
		if first {
			a.logger.Error("provider rejected the API key: polling stopped for this provider until the key changes",
				zap.String("provider", name), zap.String("answer", ans.Code))
		}
		return false
	case protocol.Backoff:
		a.backoffProvider(name, ps, now, ans)
		return false
	}
	return true
}

func (ps *providerState) ok() {
	ps.mu.Lock()
	ps.failures = 0
	ps.mu.Unlock()
}

// backoffProvider blocks polling the provider: exponentially longer with
// consecutive failures (5s doubling up to 10m), at least the block the
// answer documents, with full jitter on top of that floor.
func (a *App) backoffProvider(name string, ps *providerState, now time.Time, ans protocol.Answer) {
	ps.mu.Lock()
	ps.failures++
	floor := providerBackoffFloor() // 5s; scaled only in the drill's child
	capd := min(floor<<min(ps.failures-1, 7), 10*time.Minute)
	wait := max(ans.Wait, floor) + time.Duration(a.jitter(int64(capd)+1))
	ps.blockedUntil = now.Add(wait)
	n := ps.failures
	ps.mu.Unlock()
	a.logger.Warn("provider unavailable for polling; backing off",
		zap.String("provider", name), zap.String("answer", truncate(ans.Code, 120)),
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
