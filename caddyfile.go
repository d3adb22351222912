package pingback

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("pingback", parseGlobalOption)
	httpcaddyfile.RegisterHandlerDirective("pingback", parseHandlerDirective)
	httpcaddyfile.RegisterDirectiveOrder("pingback", httpcaddyfile.Before, "reverse_proxy")
	httpcaddyfile.RegisterHandlerDirective("pingback_track", parseTrackDirective)
	httpcaddyfile.RegisterDirectiveOrder("pingback_track", httpcaddyfile.Before, "reverse_proxy")
}

// parseGlobalOption parses the global `pingback` option into the pingback
// app. The option may appear once.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		d.Next() // load the option name so the error carries its line
		return nil, d.Err("pingback global option specified more than once")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "pingback", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from the global option. Syntax:
//
//	pingback {
//		storage_dir <path>
//		store badger|postgres {
//			dir <path>                 # badger
//			dsn <dsn>                  # postgres
//			schema <name>              # postgres
//			lease_term <duration>      # postgres
//		}
//		retention <duration>
//		keep_payload <duration>
//		min_free_space <size>
//		replay {
//			backoff <min> <max>
//			max_attempts <n>
//			forward_timeout <duration>
//			concurrency <n>
//		}
//		provider <name> {
//			endpoint <base url>
//			api_endpoint <base url>
//			api_key <key> [<key>...]
//			callback_method get|post
//			callback_format form|json
//			result_method get|post
//			give_up <duration>
//			max_age <duration>
//		}
//		poll {
//			after auto|<duration>
//			interval <duration>
//			give_up <duration>
//			batch <n>
//			rate <n>
//		}
//		notify <url> {
//			secret <secret>
//			interval <duration>
//		}
//		failing_after <duration>
//	}
//
// Every subdirective is optional and may appear once (provider once per
// provider name). The parser only parses: ranges are checked by Validate,
// for the Caddyfile and JSON alike.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume option name
	if d.NextArg() {
		return d.ArgErr()
	}
	return eachSubdirective(d, "", []string{"provider"}, func(name string) error {
		switch name {
		case "storage_dir":
			return oneArg(d, &a.StorageDir)
		case "store":
			return storeArg(d, &a.StoreRaw)
		case "retention":
			return durationArg(d, &a.Retention)
		case "keep_payload":
			return keepPayloadArg(d, &a.KeepPayload)
		case "min_free_space":
			return sizeArg(d, &a.MinFreeSpace)
		case "replay":
			a.Replay = new(ReplayConfig)
			return blockArg(d, a.Replay.unmarshalCaddyfile)
		case "provider":
			return a.unmarshalProvider(d)
		case "poll":
			a.Poll = new(PollConfig)
			return blockArg(d, a.Poll.unmarshalCaddyfile)
		case "notify":
			return a.notifyConfig().unmarshalCaddyfile(d)
		case "failing_after":
			return durationArg(d, &a.notifyConfig().FailingAfter)
		default:
			return d.Errf("unrecognized pingback option '%s'", name)
		}
	})
}

// unmarshalProvider parses `provider <name> { ... }` into a.Providers.
func (a *App) unmarshalProvider(d *caddyfile.Dispenser) error {
	var name string
	if err := providerArg(d, &name); err != nil {
		return err
	}
	if a.Providers[name] != nil {
		return d.Errf("provider %s specified more than once", name)
	}
	pc := new(ProviderConfig)
	if err := pc.unmarshalCaddyfile(d); err != nil {
		return err
	}
	if a.Providers == nil {
		a.Providers = make(map[string]*ProviderConfig)
	}
	a.Providers[name] = pc
	return nil
}

// storeArg parses `store <module> { ... }` into dst, the store guest
// module's JSON with its "module" key.
func storeArg(d *caddyfile.Dispenser, dst *json.RawMessage) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	var mod caddyfile.Unmarshaler
	name := d.Val()
	switch name {
	case "badger":
		mod = new(BadgerStore)
	case "postgres":
		mod = new(PostgresStore)
	default:
		return d.Errf("unknown store '%s': want badger or postgres", name)
	}
	if d.NextArg() {
		return d.ArgErr()
	}
	if err := mod.UnmarshalCaddyfile(d); err != nil {
		return err
	}
	*dst = caddyconfig.JSONModuleObject(mod, "module", name, nil)
	return nil
}

func (r *ReplayConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return eachSubdirective(d, "replay ", nil, func(name string) error {
		switch name {
		case "backoff":
			var lo, hi string
			if !d.Args(&lo, &hi) || d.NextArg() {
				return d.Errf("backoff takes exactly two durations: <min> <max>")
			}
			minD, err := caddy.ParseDuration(lo)
			if err != nil {
				return d.Errf("invalid backoff min '%s': %v", lo, err)
			}
			maxD, err := caddy.ParseDuration(hi)
			if err != nil {
				return d.Errf("invalid backoff max '%s': %v", hi, err)
			}
			r.BackoffMin, r.BackoffMax = caddy.Duration(minD), caddy.Duration(maxD)
			return nil
		case "max_attempts":
			return intArg(d, &r.MaxAttempts)
		case "forward_timeout":
			return durationArg(d, &r.ForwardTimeout)
		case "stuck_after":
			// Removed; parsed so that Validate can say what replaced it.
			return durationArg(d, &r.StuckAfter)
		case "concurrency":
			return intArg(d, &r.Concurrency)
		default:
			return d.Errf("unrecognized replay option '%s'", name)
		}
	})
}

func (pc *ProviderConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return eachSubdirective(d, "provider ", nil, func(name string) error {
		switch name {
		case "endpoint":
			return oneArg(d, &pc.Endpoint)
		case "api_endpoint":
			return oneArg(d, &pc.APIEndpoint)
		case "api_key":
			pc.APIKey = d.RemainingArgs()
			if len(pc.APIKey) == 0 {
				return d.ArgErr()
			}
			return nil
		case "callback_format":
			return oneArg(d, &pc.CallbackFormat)
		case "give_up":
			return durationArg(d, &pc.GiveUp)
		case "callback_method":
			return oneArg(d, &pc.CallbackMethod)
		case "result_method":
			return oneArg(d, &pc.ResultMethod)
		case "max_age":
			return durationArg(d, &pc.MaxAge)
		default:
			return d.Errf("unrecognized provider option '%s'", name)
		}
	})
}

// unmarshalCaddyfile parses `notify <url> { secret <secret> interval
// <duration> }`.
func (n *NotifyConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("notify takes the URL to POST events to")
	}
	n.URL = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return eachSubdirective(d, "notify ", nil, func(name string) error {
		switch name {
		case "secret":
			return oneArg(d, &n.Secret)
		case "interval":
			return durationArg(d, &n.Interval)
		default:
			return d.Errf("unrecognized notify option '%s'", name)
		}
	})
}

func (p *PollConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return eachSubdirective(d, "poll ", nil, func(name string) error {
		switch name {
		case "after":
			var v string
			if err := oneArg(d, &v); err != nil {
				return err
			}
			if v == "auto" {
				p.After = 0
				return nil
			}
			dur, err := caddy.ParseDuration(v)
			if err != nil {
				return d.Errf("poll after must be auto or a duration, got '%s'", v)
			}
			p.After = caddy.Duration(dur)
			return nil
		case "interval":
			return durationArg(d, &p.Interval)
		case "give_up":
			return durationArg(d, &p.GiveUp)
		case "batch":
			return intArg(d, &p.Batch)
		case "rate":
			var s string
			if err := oneArg(d, &s); err != nil {
				return err
			}
			r, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return d.Errf("poll rate must be a number of requests per second, got '%s'", s)
			}
			p.Rate = r
			return nil
		default:
			return d.Errf("unrecognized poll option '%s'", name)
		}
	})
}

// parseTrackDirective parses the `pingback_track` handler directive.
func parseTrackDirective(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	t := new(Tracker)
	err := t.UnmarshalCaddyfile(h.Dispenser)
	return t, err
}

// UnmarshalCaddyfile sets up the track handler from Caddyfile tokens.
// Syntax:
//
//	pingback_track [<matcher>] {
//		provider <name>
//		pingback_url <url>
//		max_body <size>
//		max_answer <size>
//	}
//
// provider is required; the others are optional. Each may appear once.
func (t *Tracker) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalDirective(d, "pingback_track", &t.Provider, func(name string) error {
		switch name {
		case "pingback_url":
			return oneArg(d, &t.PingbackURL)
		case "max_body":
			return sizeArg(d, &t.MaxBody)
		case "max_answer":
			return sizeArg(d, &t.MaxAnswer)
		default:
			return d.Errf("unrecognized pingback_track subdirective '%s'", name)
		}
	})
}

// parseHandlerDirective parses the `pingback` handler directive.
func parseHandlerDirective(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	handler := new(Handler)
	err := handler.UnmarshalCaddyfile(h.Dispenser)
	return handler, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	pingback [<matcher>] {
//		provider <name>
//		ack_timeout <duration>
//		max_body <size>
//		keep_headers <name...>
//		verify token|res_php|none
//		unknown_ids accept|quarantine|reject
//		max_quarantine <count> [<size>]
//	}
//
// provider is required; the others are optional. Each may appear once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalDirective(d, "pingback", &h.Provider, func(name string) error {
		switch name {
		case "ack_timeout":
			return durationArg(d, &h.AckTimeout)
		case "max_body":
			return sizeArg(d, &h.MaxBody)
		case "keep_headers":
			h.KeepHeaders = d.RemainingArgs()
			if len(h.KeepHeaders) == 0 {
				return d.ArgErr()
			}
			return nil
		case "verify":
			return choiceArg(d, &h.Verify, VerifyToken, VerifyResPHP, VerifyNone)
		case "unknown_ids":
			return choiceArg(d, &h.UnknownIDs, UnknownAccept, UnknownQuarantine, UnknownReject)
		case "max_quarantine":
			return quarantineArgs(d, h)
		default:
			return d.Errf("unrecognized pingback subdirective '%s'", name)
		}
	})
}

// blockArg parses a subdirective that takes no arguments, only a block,
// with parse.
func blockArg(d *caddyfile.Dispenser, parse func(*caddyfile.Dispenser) error) error {
	if d.NextArg() {
		return d.ArgErr()
	}
	return parse(d)
}

// unmarshalDirective parses a handler directive of the form
// `<directive> [<matcher>] { provider <name> ... }`: no arguments, each
// subdirective once, provider required and known; fn parses every other
// subdirective, with its name as d.Val().
func unmarshalDirective(d *caddyfile.Dispenser, directive string, provider *string, fn func(name string) error) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	err := eachSubdirective(d, "", nil, func(name string) error {
		if name == "provider" {
			return providerArg(d, provider)
		}
		return fn(name)
	})
	if err != nil {
		return err
	}
	if *provider == "" {
		return d.Errf("%s: provider is required (one of: %s)", directive, providerNames())
	}
	return nil
}

// eachSubdirective calls fn for each subdirective of the block the
// dispenser is in, with the subdirective's name as d.Val(). A subdirective
// may appear once unless it is listed in repeatable; a repeat is an error
// "<what><name> specified more than once".
func eachSubdirective(d *caddyfile.Dispenser, what string, repeatable []string, fn func(name string) error) error {
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] && !slices.Contains(repeatable, name) {
			return d.Errf("%s%s specified more than once", what, name)
		}
		seen[name] = true
		if err := fn(name); err != nil {
			return err
		}
	}
	return nil
}

// providerArg reads exactly one known provider name into dst.
func providerArg(d *caddyfile.Dispenser, dst *string) error {
	if err := oneArg(d, dst); err != nil {
		return err
	}
	if _, err := lookupProvider(*dst); err != nil {
		return d.Err(err.Error())
	}
	return nil
}

// oneArg reads exactly one argument into dst.
func oneArg(d *caddyfile.Dispenser, dst *string) error {
	if !d.NextArg() {
		return d.ArgErr()
	}
	*dst = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	return nil
}

// choiceArg reads exactly one argument, one of choices, into dst.
func choiceArg(d *caddyfile.Dispenser, dst *string, choices ...string) error {
	name := d.Val()
	if err := oneArg(d, dst); err != nil {
		return err
	}
	if !slices.Contains(choices, *dst) {
		return d.Errf("invalid %s '%s': want %s", name, *dst, strings.Join(choices, ", "))
	}
	return nil
}

// durationArg reads exactly one duration (Go syntax, or d for days) into
// dst.
func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return d.Errf("invalid %s '%s': %v", name, s, err)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// sizeArg reads exactly one byte size such as 64KiB into dst.
func sizeArg(d *caddyfile.Dispenser, dst *int64) error {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	size, err := humanize.ParseBytes(s)
	if err != nil || size > math.MaxInt64 {
		return d.Errf("invalid %s '%s': want a size such as 64KiB", name, s)
	}
	*dst = int64(size)
	return nil
}

// intArg reads exactly one whole number into dst.
func intArg(d *caddyfile.Dispenser, dst *int) error {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return d.Errf("%s must be a whole number, got '%s'", name, s)
	}
	*dst = n
	return nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*Tracker)(nil)
)

// quarantineArgs reads max_quarantine <count> [<size>].
func quarantineArgs(d *caddyfile.Dispenser, h *Handler) error {
	args := d.RemainingArgs()
	if len(args) < 1 || len(args) > 2 {
		return d.ArgErr()
	}
	n, err := strconv.Atoi(args[0])
	if err != nil || n < 1 {
		return d.Errf("invalid max_quarantine count '%s': want a whole number of records, at least 1", args[0])
	}
	h.MaxQuarantine = n
	if len(args) == 2 {
		size, err := humanize.ParseBytes(args[1])
		if err != nil || size < 1 || size > math.MaxInt64 {
			return d.Errf("invalid max_quarantine size '%s': want a size such as 64MiB", args[1])
		}
		h.MaxQuarantineBytes = int64(size)
	}
	return nil
}
