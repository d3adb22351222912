package pingback

import (
	"strconv"
	"time"

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
}

// parseGlobalOption parses the global `pingback` option into the pingback
// app. The option may appear once.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
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
//		retention <duration>
//		replay {
//			backoff <min> <max>
//			max_attempts <n>
//			stuck_after <duration>
//			concurrency <n>
//		}
//	}
//
// Every subdirective is optional and may appear once.
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume option name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("%s specified more than once", name)
		}
		seen[name] = true
		switch name {
		case "storage_dir":
			if err := oneArg(d, &a.StorageDir); err != nil {
				return err
			}
		case "retention":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			a.Retention = dur
		case "replay":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.Replay = new(ReplayConfig)
			if err := a.Replay.unmarshalCaddyfile(d); err != nil {
				return err
			}
		default:
			return d.Errf("unrecognized pingback option '%s'", name)
		}
	}
	return nil
}

func (r *ReplayConfig) unmarshalCaddyfile(d *caddyfile.Dispenser) error {
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("replay %s specified more than once", name)
		}
		seen[name] = true
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
			if minD <= 0 || maxD < minD {
				return d.Errf("backoff needs 0 < min <= max, got %s %s", lo, hi)
			}
			r.BackoffMin, r.BackoffMax = caddy.Duration(minD), caddy.Duration(maxD)
		case "max_attempts":
			n, err := positiveIntArg(d)
			if err != nil {
				return err
			}
			r.MaxAttempts = n
		case "stuck_after":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			r.StuckAfter = dur
		case "concurrency":
			n, err := positiveIntArg(d)
			if err != nil {
				return err
			}
			r.Concurrency = n
		default:
			return d.Errf("unrecognized replay option '%s'", name)
		}
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
//		provider captchaai|2captcha|rucaptcha
//		ack_timeout <duration>
//		max_body <size>
//	}
//
// provider is required; the others are optional. Each may appear once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		name := d.Val()
		if seen[name] {
			return d.Errf("%s specified more than once", name)
		}
		seen[name] = true
		switch name {
		case "provider":
			if err := oneArg(d, &h.Provider); err != nil {
				return err
			}
			if _, err := lookupProvider(h.Provider); err != nil {
				return d.Err(err.Error())
			}
		case "ack_timeout":
			dur, err := durationArg(d)
			if err != nil {
				return err
			}
			h.AckTimeout = dur
		case "max_body":
			var s string
			if err := oneArg(d, &s); err != nil {
				return err
			}
			size, err := humanize.ParseBytes(s)
			if err != nil || size == 0 || size > 1<<30 {
				return d.Errf("invalid max_body '%s': want a size such as 64KiB (at most 1GiB)", s)
			}
			h.MaxBody = int64(size)
		default:
			return d.Errf("unrecognized pingback subdirective '%s'", name)
		}
	}
	if h.Provider == "" {
		return d.Errf("pingback: provider is required (one of: %s)", providerNames())
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

// durationArg reads exactly one positive duration.
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
	if dur <= 0 {
		return 0, d.Errf("%s must be positive, got %s", name, time.Duration(dur))
	}
	return caddy.Duration(dur), nil
}

// positiveIntArg reads exactly one integer >= 1.
func positiveIntArg(d *caddyfile.Dispenser) (int, error) {
	name := d.Val()
	var s string
	if err := oneArg(d, &s); err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, d.Errf("%s must be a whole number of at least 1, got '%s'", name, s)
	}
	return n, nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Handler)(nil)
)
