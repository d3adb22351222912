package pingback

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

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
	pc.key = repl.ReplaceAll(pc.APIKey, "")
	pc.keyErr = nil
	if pc.APIKey != "" && pc.key == "" {
		pc.keyErr = fmt.Errorf("provider %s: api_key %q resolves to an empty key (is the environment variable set?)", name, pc.APIKey)
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
	if pc == nil || pc.key == "" {
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
