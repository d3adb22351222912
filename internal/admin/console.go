package admin

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// consoleFiles holds the console's page: one HTML page, its script and its
// style sheet, plain files with no build step and no external assets; and
// under vendor/ the charting library uPlot as published on npm, with its
// licence (consoleUPlotJS, consoleUPlotCSS).
//
//go:embed console
var consoleFiles embed.FS

// The vendored uPlot the page's charts use, served as the page's own files.
const (
	consoleUPlotJS  = "/vendor/uPlot.iife.min.js"
	consoleUPlotCSS = "/vendor/uPlot.min.css"
)

// consolePage is console/index.html, filled in with the page's action
// token, the store's states, the providers the plugin knows (the search
// by task id asks each) and the backend's time (Backend.Now: the page's
// clock for its charts' range and its "ago"s) at each load.
var consolePage = template.Must(template.ParseFS(consoleFiles, "console/index.html"))

// Console serves the operator's web page of one pingback app (the root
// package's handler pingback_console documents what it shows) under its
// mount point:
//
//	GET  /             the page (text/html)
//	GET  /console.js, /console.css, /vendor/uPlot.iife.min.js, /vendor/uPlot.min.css
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
	backend  Backend
	api      *API
	routes   *http.ServeMux                // the admin routes' patterns, matched as Caddy's admin endpoint matches them
	handlers map[string]caddy.AdminHandler // by pattern
	original func(r *http.Request) *http.Request
	now      func() time.Time
}

// ConsoleOptions are a Console's optional settings.
type ConsoleOptions struct {
	// Original returns the request as it reached the server, before
	// handle_path or a rewrite changed its path (the redirect to the
	// mount point and the Location of a started bulk replay use it).
	// Default: the request itself.
	Original func(r *http.Request) *http.Request
	// Now is the clock of the page's tokens. Default: time.Now.
	Now func() time.Time
}

// NewConsole returns the console of backend, whose API requests api
// serves (and refuses, 503, while backend is not the running app).
func NewConsole(backend Backend, api *API, opts ConsoleOptions) *Console {
	c := &Console{backend: backend, api: api, routes: http.NewServeMux(), handlers: map[string]caddy.AdminHandler{},
		original: opts.Original, now: opts.Now}
	if c.original == nil {
		c.original = func(r *http.Request) *http.Request { return r }
	}
	if c.now == nil {
		c.now = time.Now
	}
	if api != nil {
		for _, rt := range api.Routes() {
			c.routes.Handle(rt.Pattern, http.NotFoundHandler()) // only its pattern is used
			c.handlers[rt.Pattern] = rt.Handler
		}
	}
	return c
}

// ServeHTTP serves the page, its assets and its API. An error of the page
// or an asset is a caddy.APIError with the status to answer (the caller
// turns it into its server's error); the API answers its errors itself.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	p := r.URL.Path
	if rest, ok := strings.CutPrefix(p, "/api/"); ok {
		return c.serveAPI(w, r, rest)
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET", r.Method)}
	}
	switch p {
	case "", "/":
		return c.servePage(w, r)
	case "/console.js", "/console.css", consoleUPlotJS, consoleUPlotCSS:
		return serveConsoleAsset(w, r, p[1:])
	}
	return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no console page %s", p)}
}

// servePage answers the page with a fresh action token. A request for the
// mount point without its trailing slash ("/console" under handle_path
// /console*) is redirected to it, so that the page's relative URLs resolve
// under the mount.
func (c *Console) servePage(w http.ResponseWriter, r *http.Request) error {
	orig := c.original(r)
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
	err := consolePage.Execute(&buf, map[string]string{"Token": c.NewToken(), "States": strings.Join(states, " "),
		"Providers": strings.Join(protocol.Names(), " "), "Now": c.pageNow().UTC().Format(time.RFC3339Nano)})
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	setConsoleHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, err = w.Write(buf.Bytes())
	return err
}

// pageNow is the time the page is told it is: the backend's clock, or
// the console's without a backend.
func (c *Console) pageNow() time.Time {
	if c.backend == nil {
		return c.now()
	}
	return c.backend.Now()
}

// serveConsoleAsset answers one of the embedded files.
func serveConsoleAsset(w http.ResponseWriter, r *http.Request, name string) error {
	data, err := fs.ReadFile(consoleFiles, "console/"+name)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: err}
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
