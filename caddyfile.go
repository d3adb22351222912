package pingback

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"

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
//			api_key <key>
//			callback_method get|post
//			callback_format form|json
//			result_method get|post
//			give_up <duration>
//		}
//		poll {
//			after auto|<duration>
//			interval <duration>
//			give_up <duration>
//			batch <n>
//			rate <n>
//		}
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
			if err := oneArg(d, &a.StorageDir); err != nil {
				return err
			}
		case "store":
			raw, err := storeArg(d)
			if err != nil {
				return err
			}
			a.StoreRaw = raw
		case "retention":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			a.Retention = dur
		case "min_free_space":
			size, err := sizeArg(d)
			if err != nil {
				return err
			}
			a.MinFreeSpace = size
		case "replay":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.Replay = new(ReplayConfig)
			if err := a.Replay.unmarshalCaddyfile(d); err != nil {
				return err
			}
		case "provider":
			var pname string
			if !d.NextArg() {
				return d.ArgErr()
			}
			pname = d.Val()
			if d.NextArg() {
				return d.ArgErr()
			}
			if _, err := lookupProvider(pname); err != nil {
				return d.Err(err.Error())
			}
			if a.Providers[pname] != nil {
				return d.Errf("provider %s specified more than once", pname)
			}
			pc := new(ProviderConfig)
			if err := pc.unmarshalCaddyfile(d); err != nil {
				return err
			}
			if a.Providers == nil {
				a.Providers = make(map[string]*ProviderConfig)
			}
			a.Providers[pname] = pc
		case "poll":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.Poll = new(PollConfig)
			if err := a.Poll.unmarshalCaddyfile(d); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized pingback option '%s'", name)
		}
		return nil
	})
}

// storeArg parses `store <module> { ... }` into the store guest module's
// JSON, with its "module" key.
func storeArg(d *caddyfile.Dispenser) (json.RawMessage, error) {
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	var mod caddyfile.Unmarshaler
	name := d.Val()
	switch name {
	case "badger":
		mod = new(BadgerStore)
	case "postgres":
		mod = new(PostgresStore)
	default:
		return nil, d.Errf("unknown store '%s': want badger or postgres", name)
	}
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	if err := mod.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return caddyconfig.JSONModuleObject(mod, "module", name, nil), nil
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
		case "max_attempts":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			r.MaxAttempts = n
		case "forward_timeout":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			r.ForwardTimeout = dur
		case "stuck_after":
			// Removed; parsed so that Validate can say what replaced it.
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			r.StuckAfter = dur
		case "concurrency":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			r.Concurrency = n
		default:
			return d.Errf("unrecognized replay option '%s'", name)
		}
		return nil
	})
}

func (pc *ProviderConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return eachSubdirective(d, "provider ", nil, func(name string) error {
		switch name {
		case "endpoint":
			if err := oneArg(d, &pc.Endpoint); err != nil {
				return err
			}
		case "api_endpoint":
			if err := oneArg(d, &pc.APIEndpoint); err != nil {
				return err
			}
		case "api_key":
			if err := oneArg(d, &pc.APIKey); err != nil {
				return err
			}
		case "callback_format":
			if err := oneArg(d, &pc.CallbackFormat); err != nil {
				return err
			}
		case "give_up":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			pc.GiveUp = dur
		case "callback_method":
			if err := oneArg(d, &pc.CallbackMethod); err != nil {
				return err
			}
		case "result_method":
			if err := oneArg(d, &pc.ResultMethod); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized provider option '%s'", name)
		}
		return nil
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
		case "interval":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			p.Interval = dur
		case "give_up":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			p.GiveUp = dur
		case "batch":
			n, err := intArg(d)
			if err != nil {
				return err
			}
			p.Batch = n
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
		default:
			return d.Errf("unrecognized poll option '%s'", name)
		}
		return nil
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
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	err := eachSubdirective(d, "", nil, func(name string) error {
		switch name {
		case "provider":
			return providerArg(d, &t.Provider)
		case "pingback_url":
			if err := oneArg(d, &t.PingbackURL); err != nil {
				return err
			}
		case "max_body":
			size, err := sizeArg(d)
			if err != nil {
				return err
			}
			t.MaxBody = size
		case "max_answer":
			size, err := sizeArg(d)
			if err != nil {
				return err
			}
			t.MaxAnswer = size
		default:
			return d.Errf("unrecognized pingback_track subdirective '%s'", name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if t.Provider == "" {
		return d.Errf("pingback_track: provider is required (one of: %s)", providerNames())
	}
	return nil
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
//	}
//
// provider is required; the others are optional. Each may appear once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	err := eachSubdirective(d, "", nil, func(name string) error {
		switch name {
		case "provider":
			return providerArg(d, &h.Provider)
		case "ack_timeout":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			h.AckTimeout = dur
		case "max_body":
			size, err := sizeArg(d)
			if err != nil {
				return err
			}
			h.MaxBody = size
		case "keep_headers":
			h.KeepHeaders = d.RemainingArgs()
			if len(h.KeepHeaders) == 0 {
				return d.ArgErr()
			}
		default:
			return d.Errf("unrecognized pingback subdirective '%s'", name)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if h.Provider == "" {
		return d.Errf("pingback: provider is required (one of: %s)", providerNames())
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

// durationArg reads exactly one duration (Go syntax, or d for days).
func durationArg(d *caddyfile.Dispenser) (caddy.Duration, error) {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(s)
	if err != nil {
		return 0, d.Errf("invalid %s '%s': %v", name, s, err)
	}
	return caddy.Duration(dur), nil
}

// sizeArg reads exactly one byte size such as 64KiB.
func sizeArg(d *caddyfile.Dispenser) (int64, error) {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return 0, err
	}
	size, err := humanize.ParseBytes(s)
	if err != nil || size > math.MaxInt64 {
		return 0, d.Errf("invalid %s '%s': want a size such as 64KiB", name, s)
	}
	return int64(size), nil
}

// intArg reads exactly one whole number.
func intArg(d *caddyfile.Dispenser) (int, error) {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, d.Errf("%s must be a whole number, got '%s'", name, s)
	}
	return n, nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Handler)(nil)
	_ caddyfile.Unmarshaler = (*Tracker)(nil)
)
