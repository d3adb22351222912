package pingback

import (
	"errors"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-pingback/pingback/internal/admin"
)

func init() {
	caddy.RegisterModule(Console{})
	httpcaddyfile.RegisterHandlerDirective("pingback_console", parseConsoleDirective)
	httpcaddyfile.RegisterDirectiveOrder("pingback_console", httpcaddyfile.Before, "file_server")
}

// Console is the operator's web page (handler pingback_console): the
// overview of GET /pingback/status (with each provider's unpollable tasks
// and accounts: account id, api_key entry, budget, pending tasks; and the
// routes whose replays are held back, while there are any), the stored
// results by state (the dead-letter queue) with linkable filters
// (?state=parked&provider=...), one result with its attempt history, the
// tracked tasks (each labelled with its account, filtered by it with
// ?view=tasks&account=...), replay of one result, bulk replay with its
// progress, and purge where the admin API offers it. It ends the handler
// chain.
//
// Mount it at a site's root or under a path of your choice with
// handle_path (the page uses relative URLs only), behind your own
// authentication (basic_auth, forward_auth...): it can replay and purge.
// Under the mount it answers:
//
//	GET  /             the page (text/html)
//	GET  /console.js, /console.css
//	     /api/<route>  the admin API's /pingback/<route>, served in-process by
//	                   the admin API's own handlers (same requests, same
//	                   answers; errors as {"error": "..."})
//
// Every /api/ request must carry the page's token in the
// X-Pingback-Console-Token header (403 otherwise), and state-changing ones
// (any method but GET and HEAD) must come from the page's own origin: an
// Origin header naming the request's host, or, without Origin,
// Sec-Fetch-Site: same-origin (403 otherwise). Credential headers of stored
// requests (Authorization, Cookie, X-Api-Key...) reach the page redacted,
// as every admin answer has them. Package admin serves it (admin.Console).
type Console struct {
	app     *App
	console *admin.Console
}

// ConsoleTokenHeader is the request header that carries the console page's
// action token.
const ConsoleTokenHeader = admin.ConsoleTokenHeader

// CaddyModule returns the Caddy module information.
func (Console) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.pingback_console", New: func() caddy.Module { return new(Console) }}
}

// Provision loads the pingback app, so that a config with only the
// console still runs the store the console shows.
func (c *Console) Provision(ctx caddy.Context) error {
	app, err := loadApp(ctx)
	if err != nil {
		return err
	}
	c.app = app
	c.console = admin.NewConsole(c.app, newAdminRoutes(), admin.ConsoleOptions{Original: originalRequest})
	return nil
}

// ServeHTTP serves the page, its assets and its API; the page's errors
// are Caddy's HTTP errors (caddyhttp.Error) of their status.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	err := c.console.ServeHTTP(w, r)
	var apiErr caddy.APIError
	if errors.As(err, &apiErr) {
		return caddyhttp.Error(apiErr.HTTPStatus, apiErr.Err)
	}
	return err
}

// originalRequest returns the request as it reached the server, before
// handle_path or a rewrite changed its path (r itself outside a server).
func originalRequest(r *http.Request) *http.Request {
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		return &orig
	}
	return r
}

// parseConsoleDirective parses `pingback_console [<matcher>]`.
func parseConsoleDirective(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	c := new(Console)
	return c, c.UnmarshalCaddyfile(h.Dispenser)
}

// UnmarshalCaddyfile parses `pingback_console`: no arguments, no block.
func (c *Console) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return parseNoOptions(d)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Console)(nil)
	_ caddyhttp.MiddlewareHandler = (*Console)(nil)
	_ caddyfile.Unmarshaler       = (*Console)(nil)
)
