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
	switch strings.ToLower(pc.CallbackMethod) {
	case "":
		pc.method = http.MethodPost
		if prov.LegacyCallback == protocol.FormGET {
			pc.method = http.MethodGet
		}
	case "get":
		pc.method = http.MethodGet
	case "post":
		pc.method = http.MethodPost
	default:
		return fmt.Errorf("provider %s: callback_method must be get or post, got %q", name, pc.CallbackMethod)
	}
	switch strings.ToLower(pc.ResultMethod) {
	case "":
		pc.resMethod = http.MethodGet
		if prov.ResultPOST {
			pc.resMethod = http.MethodPost
		}
	case "get":
		pc.resMethod = http.MethodGet
	case "post":
		pc.resMethod = http.MethodPost
	default:
		return fmt.Errorf("provider %s: result_method must be get or post, got %q", name, pc.ResultMethod)
	}
	if pc.ResultMethod != "" && !prov.Has(protocol.Legacy) {
		return fmt.Errorf("provider %s: result_method applies to res.php, and the plugin knows no in.php/res.php API of this provider", name)
	}
	switch strings.ToLower(pc.CallbackFormat) {
	case "":
		pc.format = prov.JSONCallback
	case "form":
		pc.format = protocol.FormPOST
	case "json":
		pc.format = protocol.JSONPOST
	default:
		return fmt.Errorf("provider %s: callback_format must be form or json, got %q", name, pc.CallbackFormat)
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
