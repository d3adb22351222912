package pingback

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	caddy.RegisterModule(Console{})
	httpcaddyfile.RegisterHandlerDirective("pingback_console", parseConsoleDirective)
	httpcaddyfile.RegisterDirectiveOrder("pingback_console", httpcaddyfile.Before, "file_server")
}

// consoleFiles holds the console's page: one HTML page, its script and its
// style sheet, plain files with no build step and no external assets.
//
//go:embed console
var consoleFiles embed.FS

// consolePage is console/index.html, filled in with the page's action
// token and the store's states at each load.
var consolePage = template.Must(template.ParseFS(consoleFiles, "console/index.html"))

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
// as every admin answer has them.
type Console struct {
	app *App
}

// CaddyModule returns the Caddy module information.
func (Console) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.pingback_console", New: func() caddy.Module { return new(Console) }}
}

// Provision loads the pingback app, so that a config with only the
// console still runs the store the console shows.
func (c *Console) Provision(ctx caddy.Context) error {
	app, err := ctx.App("pingback")
	if err != nil {
		return fmt.Errorf("loading pingback app: %w", err)
	}
	c.app = app.(*App)
	return nil
}

// ServeHTTP serves the page, its assets and its API.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	p := r.URL.Path
	if rest, ok := strings.CutPrefix(p, "/api/"); ok {
		return c.serveAPI(w, r, rest)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed: use GET", r.Method))
	}
	switch p {
	case "", "/":
		return c.servePage(w, r)
	case "/console.js", "/console.css":
		return serveConsoleAsset(w, r, p[1:])
	}
	return caddyhttp.Error(http.StatusNotFound, fmt.Errorf("no console page %s", p))
}

// servePage answers the page with a fresh action token. A request for the
// mount point without its trailing slash ("/console" under handle_path
// /console*) is redirected to it, so that the page's relative URLs resolve
// under the mount.
func (c *Console) servePage(w http.ResponseWriter, r *http.Request) error {
	orig := originalRequest(r)
	if !strings.HasSuffix(orig.URL.Path, "/") {
		u := *orig.URL
		u.Path += "/"
		u.RawPath = ""
		http.Redirect(w, r, u.RequestURI(), http.StatusMovedPermanently)
		return nil
	}
	states := make([]string, len(store.States))
	for i, s := range store.States {
		states[i] = string(s)
	}
	var buf bytes.Buffer
	err := consolePage.Execute(&buf, map[string]string{"Token": newConsoleToken(), "States": strings.Join(states, " ")})
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	setConsoleHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, err = w.Write(buf.Bytes())
	return err
}

// serveConsoleAsset answers one of the embedded files.
func serveConsoleAsset(w http.ResponseWriter, r *http.Request, name string) error {
	data, err := fs.ReadFile(consoleFiles, "console/"+name)
	if err != nil {
		return caddyhttp.Error(http.StatusNotFound, err)
	}
	ctype := "text/css; charset=utf-8"
	if strings.HasSuffix(name, ".js") {
		ctype = "text/javascript; charset=utf-8"
	}
	setConsoleHeaders(w.Header())
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", "no-cache")
	if r.Method == http.MethodHead {
		return nil
	}
	_, err = w.Write(data)
	return err
}

// setConsoleHeaders sets the headers every console answer carries: no
// framing, no inline script, nothing from another origin, no sniffing, no
// referrer, no caching of the page (its token is per load).
func setConsoleHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "+
		"img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
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

// ConsoleTokenHeader is the request header that carries the console page's
// action token.
const ConsoleTokenHeader = "X-Pingback-Console-Token"

// consoleTokenLife is how long a page's token is accepted after the page
// was served; a page left open longer asks to be reloaded.
const consoleTokenLife = 12 * time.Hour

// consoleSecret keys the tokens: random per process, so a token is valid
// across config reloads but not after a restart.
var consoleSecret = sync.OnceValue(func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather than return an error)
	return b
})

// consoleNow is the tokens' clock (replaced in tests).
var consoleNow = time.Now

// newConsoleToken returns a fresh token: a random nonce, the issue time in
// Unix seconds and an HMAC-SHA256 of both under the process's secret,
// base64url, joined by dots.
func newConsoleToken() string {
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	n := base64.RawURLEncoding.EncodeToString(nonce)
	ts := strconv.FormatInt(consoleNow().Unix(), 10)
	return n + "." + ts + "." + consoleMAC(n, ts)
}

func consoleMAC(nonce, ts string) string {
	m := hmac.New(sha256.New, consoleSecret())
	m.Write([]byte(nonce + "." + ts))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkConsoleToken reports why tok is not a valid, unexpired token.
func checkConsoleToken(tok string) error {
	if tok == "" {
		return errors.New("missing " + ConsoleTokenHeader + " header: reload the console page")
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || !hmac.Equal([]byte(parts[2]), []byte(consoleMAC(parts[0], parts[1]))) {
		return errors.New("invalid console token: reload the console page")
	}
	issued, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return errors.New("invalid console token: reload the console page")
	}
	if age := consoleNow().Sub(time.Unix(issued, 0)); age > consoleTokenLife || age < -time.Minute {
		return errors.New("console token expired: reload the console page")
	}
	return nil
}

// checkConsoleRequest reports why an API request must be refused as
// possibly cross-site: no valid token; a no-cors or null-origin request;
// an Origin whose host is not the request's Host; or a state-changing
// request with neither Origin nor Sec-Fetch-Site: same-origin.
func checkConsoleRequest(r *http.Request) error {
	if err := checkConsoleToken(r.Header.Get(ConsoleTokenHeader)); err != nil {
		return err
	}
	if strings.Contains(r.Header.Get("Sec-Fetch-Mode"), "no-cors") {
		return errors.New("cross-site request refused: no-cors mode")
	}
	origin, hasOrigin := r.Header["Origin"]
	if hasOrigin {
		u, err := url.Parse(origin[0])
		if len(origin) != 1 || err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return errors.New("cross-site request refused: Origin " + strconv.Quote(strings.Join(origin, ", ")) + " is not this console's")
		}
		return nil
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return nil
	}
	if r.Header.Get("Sec-Fetch-Site") != "same-origin" {
		return errors.New("cross-site request refused: no Origin header and not Sec-Fetch-Site: same-origin")
	}
	return nil
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Console)(nil)
	_ caddyhttp.MiddlewareHandler = (*Console)(nil)
	_ caddyfile.Unmarshaler       = (*Console)(nil)
)
