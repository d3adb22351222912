package pingback

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Health{})
	httpcaddyfile.RegisterHandlerDirective("pingback_health", parseHealthDirective)
	httpcaddyfile.RegisterDirectiveOrder("pingback_health", httpcaddyfile.Before, "respond")
}

// Health is the load balancer's health check (handler pingback_health): it
// answers 200 "store available" while the pingback app's store takes
// writes, and 503 "store unavailable" while it does not (the database is
// unreachable, the disk is full, or the store did not open), so that a load
// balancer sends pingbacks to an instance that can make them durable. It
// ends the handler chain.
type Health struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (Health) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.pingback_health", New: func() caddy.Module { return new(Health) }}
}

// Provision finds the pingback app.
func (h *Health) Provision(ctx caddy.Context) error {
	app, err := loadApp(ctx)
	h.app = app
	return err
}

// ServeHTTP answers the health check.
func (h *Health) ServeHTTP(w http.ResponseWriter, _ *http.Request, _ caddyhttp.Handler) error {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if st := h.app.readyStore(); st != nil && st.Available() {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("store available\n"))
		return nil
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte("store unavailable\n"))
	return nil
}

// parseHealthDirective parses `pingback_health [<matcher>]` (no options).
func parseHealthDirective(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	hc := new(Health)
	return hc, hc.UnmarshalCaddyfile(h.Dispenser)
}

// UnmarshalCaddyfile parses `pingback_health`: no arguments, no block.
func (h *Health) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseNoOptions(d)
}

// parseNoOptions parses a directive that takes no arguments and no block
// (pingback_health, pingback_console).
func parseNoOptions(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(d.Nesting()) {
		return d.Errf("%s takes no options, got '%s'", name, d.Val())
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Health)(nil)
	_ caddyhttp.MiddlewareHandler = (*Health)(nil)
	_ caddyfile.Unmarshaler       = (*Health)(nil)
)
