package pingback

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// provider is what the plugin knows of one solving service; the facts and
// their sources live in internal/protocol and docs/protocols.md.
type provider = protocol.Provider

// providerNames lists the known providers, sorted, for messages.
func providerNames() string { return protocol.NameList() }

// lookupProvider returns the named provider or an error naming the known ones.
func lookupProvider(name string) (provider, error) {
	p, ok := protocol.Lookup(name)
	if !ok {
		return provider{}, fmt.Errorf("unknown provider %q (known: %s)", name, providerNames())
	}
	return p, nil
}

// Defaults of the poll configuration.
const (
	DefaultPollInterval = 10 * time.Second
	MinPollInterval     = 5 * time.Second
	DefaultGiveUp       = 15 * time.Minute
	DefaultPollBatch    = 50
	DefaultPollRate     = 5.0

	// The poller's res.php budget per account (API key) and process (per
	// account and database with a shared store): at most 10 requests per
	// task of the account tracked since start plus pollAllowance, half of
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

	// The accounts' API keys: one key (a string) or several (an array),
	// each an account the plugin may poll for. A task is polled, confirmed
	// and answered locally with the key of the account it was submitted
	// with (sent to res.php as key and to getTaskResult as clientKey);
	// a task submitted with a key not listed here is delivered when its
	// pingback comes but never polled. Placeholders such as
	// {env.CAPTCHAAI_KEY} are resolved at provision, one placeholder being
	// one key; two entries resolving to the same key are an error, and an
	// entry that is given but resolves empty fails the app's start (not
	// `caddy validate`). Tasks stored before tasks had accounts belong to
	// the first key's account. Required for polling; never logged, shown
	// or stored (logs and the admin API show each account's id,
	// accountID, next to its placeholder).
	APIKey APIKeys `json:"api_key,omitempty"`

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

	// The oldest a result of this provider may be and still be replayed
	// or delivered from a poll, measured from its task's submission when
	// the task was tracked, else from its receipt. An older one is kept,
	// not forwarded, and marked expired (state expired, expired_reason
	// max_age); a replay by hand still delivers it. The live forward of a
	// pingback is never held back by it. Default: none (every result is
	// forwarded whatever its age). Needs no api_key.
	MaxAge caddy.Duration `json:"max_age,omitempty"`

	endpoint    string                  // resolved, without trailing slash
	apiEndpoint string                  // resolved, without trailing slash
	accounts    []account               // resolved api_key entries, in order
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

	// Most res.php and getTaskResult requests per second per account (one
	// API key of a provider; with PostgreSQL, for every instance together).
	// Default: 5.
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

// provision resolves a provider block: endpoints (defaults from
// internal/protocol), the API key's placeholders, the delivery formats of
// polled results and the effective give_up. globalGiveUp is the poll
// option's give_up.
func (pc *ProviderConfig) provision(name string, globalGiveUp time.Duration) error {
	prov, err := lookupProvider(name)
	if err != nil {
		return err
	}
	repl := caddy.NewReplacer()
	resolveURL := func(what, given, def string) (string, error) {
		u := strings.TrimRight(repl.ReplaceAll(given, ""), "/")
		if u == "" {
			u = def
		}
		if given != "" && def == "" {
			api := "legacy in.php/res.php"
			if what == "api_endpoint" {
				api = "JSON createTask/getTaskResult"
			}
			return "", fmt.Errorf("provider %s: %s given, but the plugin knows no %s API of this provider", name, what, api)
		}
		if u == "" {
			return "", nil
		}
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return "", fmt.Errorf("provider %s: %s %q is not an http(s) URL", name, what, u)
		}
		return u, nil
	}
	if pc.endpoint, err = resolveURL("endpoint", pc.Endpoint, prov.LegacyEndpoint); err != nil {
		return err
	}
	if pc.apiEndpoint, err = resolveURL("api_endpoint", pc.APIEndpoint, prov.JSONEndpoint); err != nil {
		return err
	}
	if err := pc.provisionAccounts(name, repl); err != nil {
		return err
	}
	callbackDefault := http.MethodPost
	if prov.LegacyCallback == protocol.FormGET {
		callbackDefault = http.MethodGet
	}
	if pc.method, err = oneOf(name, "callback_method", pc.CallbackMethod, callbackDefault, methodWords); err != nil {
		return err
	}
	resDefault := http.MethodGet
	if prov.ResultPOST {
		resDefault = http.MethodPost
	}
	if pc.resMethod, err = oneOf(name, "result_method", pc.ResultMethod, resDefault, methodWords); err != nil {
		return err
	}
	if pc.ResultMethod != "" && !prov.Has(protocol.Legacy) {
		return fmt.Errorf("provider %s: result_method applies to res.php, and the plugin knows no in.php/res.php API of this provider", name)
	}
	if pc.format, err = oneOf(name, "callback_format", pc.CallbackFormat, prov.JSONCallback, formatWords); err != nil {
		return err
	}
	if pc.CallbackFormat != "" && !prov.Has(protocol.JSON) {
		return fmt.Errorf("provider %s: callback_format applies to createTask tasks, and the plugin knows no JSON API of this provider", name)
	}
	if pc.GiveUp < 0 {
		return fmt.Errorf("provider %s: give_up must be positive, got %s", name, time.Duration(pc.GiveUp))
	}
	pc.giveUp = globalGiveUp
	if pc.GiveUp > 0 {
		pc.giveUp = min(pc.giveUp, time.Duration(pc.GiveUp))
	}
	if prov.Retention > 0 {
		pc.giveUp = min(pc.giveUp, prov.Retention)
	}
	return nil
}

// A word of a provider option and what it resolves to.
type word[T any] struct {
	text  string // lower case
	value T
}

// The words of callback_method and result_method, and of callback_format.
var (
	methodWords = []word[string]{{"get", http.MethodGet}, {"post", http.MethodPost}}
	formatWords = []word[protocol.CallbackFormat]{{"form", protocol.FormPOST}, {"json", protocol.JSONPOST}}
)

// oneOf resolves the provider option named option, given as given: def
// when empty, else the value of the word it spells in any case. Another
// value is an error naming the provider, the option and its words.
func oneOf[T any](provider, option, given string, def T, words []word[T]) (T, error) {
	if given == "" {
		return def, nil
	}
	lower := strings.ToLower(given)
	texts := make([]string, len(words))
	for i, w := range words {
		if lower == w.text {
			return w.value, nil
		}
		texts[i] = w.text
	}
	var zero T
	return zero, fmt.Errorf("provider %s: %s must be %s, got %q", provider, option, strings.Join(texts, " or "), given)
}

// validate checks the provider block against the poll settings: its
// give_up must leave time for a first poll.
func (pc *ProviderConfig) validate(name string, p *PollConfig) error {
	if err := pc.validateMaxAge(name); err != nil {
		return err
	}
	if pc.GiveUp > 0 && time.Duration(pc.GiveUp) <= p.firstPoll() {
		return fmt.Errorf("provider %s: give_up (%s) must be longer than the first poll time (%s): every task would expire unpolled",
			name, time.Duration(pc.GiveUp), afterText(p))
	}
	return nil
}

// afterText describes the first poll time for messages.
func afterText(p *PollConfig) string {
	if p.After > 0 {
		return "after " + time.Duration(p.After).String()
	}
	return "after auto: " + autoAfterHigh().String() + " until delays are observed"
}

// checkProviderKeys fails for an api_key that was given but resolved empty
// (an unset {env.VAR}). Called when the app starts, so that `caddy
// validate` on a machine without the secret still works.
func (a *App) checkProviderKeys() error {
	for _, name := range protocol.Names() {
		if pc := a.Providers[name]; pc != nil && pc.keyErr != nil {
			return pc.keyErr
		}
	}
	return nil
}

// pollable says why tasks of the provider, submitted through api, cannot be
// polled, or returns nil.
func (a *App) pollable(name string, api protocol.API) error {
	prov, err := lookupProvider(name)
	if err != nil {
		return err
	}
	if !prov.Has(api) {
		return fmt.Errorf("provider %s has no %s API the plugin can poll", name, api)
	}
	pc := a.Providers[name]
	if pc == nil || len(pc.accounts) == 0 {
		return fmt.Errorf("provider %s cannot be polled: no api_key configured (global option: pingback { provider %s { api_key ... } })", name, name)
	}
	return nil
}

// validatePolling checks the poll settings and every provider block.
func (a *App) validatePolling() error {
	if err := a.Poll.validate(); err != nil {
		return err
	}
	for _, name := range protocol.Names() {
		if pc := a.Providers[name]; pc != nil {
			if err := pc.validate(name, a.Poll); err != nil {
				return err
			}
		}
	}
	return nil
}
