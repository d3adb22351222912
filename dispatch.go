package pingback

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-pingback/pingback/internal/store"
)

// dispatchCtxKey marks a request the app dispatches in-process; its value
// is a *dispatch. The pingback handler that sees it only forwards and
// reports the outcome there.
type dispatchCtxKey struct{}

// dispatch carries the pingback handler's report back to the dispatcher.
type dispatch struct {
	probe   bool // only find out whether a pingback handler takes it
	reached bool // a pingback handler took the request
	out     outcome
}

// dispatch delivers a stored record to the app through the same Caddy server
// and route as a live callback: it rebuilds the original request, marks it,
// and calls the server's ServeHTTP in-process, so the route's handlers and
// the user's reverse_proxy run as they do for the provider's request.
func (a *App) dispatch(ctx context.Context, rec *store.Record, source store.Source, attempt int) outcome {
	srv, err := a.serverFor(rec)
	if err != nil {
		return outcome{class: retryable, status: http.StatusBadGateway, err: err}
	}
	req, err := rebuildRequest(ctx, rec)
	if err != nil {
		// A stored request that cannot be rebuilt never will be.
		return outcome{class: rejected, status: http.StatusBadRequest, err: err}
	}
	setDeliveryHeaders(req.Header, rec.Key(), source, attempt)
	d := new(dispatch)
	req = req.WithContext(context.WithValue(req.Context(), dispatchCtxKey{}, d))
	if v := serveRecovering(srv, req); v != nil && !d.reached {
		// A handler before the pingback handler panicked.
		return outcome{class: retryable, err: fmt.Errorf("route aborted the replay: %v", v)}
	}
	if !d.reached {
		return outcome{class: retryable, status: http.StatusBadGateway,
			err: fmt.Errorf("no pingback handler took %s %s on server %q (route changed?)", rec.Request.Method, uriPath(rec.Request.URI), rec.Server)}
	}
	return d.out
}

// serveRecovering serves req in-process through srv and returns what a
// handler panicked with, if one did: an in-process dispatch has no net/http
// server around it to recover, and must never crash Caddy.
func serveRecovering(srv *caddyhttp.Server, req *http.Request) (panicked any) {
	defer func() { panicked = recover() }()
	srv.ServeHTTP(discardWriter{h: make(http.Header)}, req)
	return nil
}

// httpApp returns the running config's http app.
func (a *App) httpApp() (*caddyhttp.App, error) {
	v, err := a.ctx.AppIfConfigured("http")
	if err != nil {
		return nil, fmt.Errorf("http app: %w", err)
	}
	app, ok := v.(*caddyhttp.App)
	if !ok {
		return nil, errors.New("http app has an unexpected type")
	}
	return app, nil
}

// serverFor finds the server a stored record is dispatched through: the one
// that received it, by name, if that server still listens on the port the
// request came in on; otherwise the one listening on that port now. (The
// Caddyfile adapter names servers srv0, srv1, ... in order, so adding a site
// can move a name to another port.)
func (a *App) serverFor(rec *store.Record) (*caddyhttp.Server, error) {
	app, err := a.httpApp()
	if err != nil {
		return nil, err
	}
	port := addrPort(rec.Request.LocalAddr)
	if srv := app.Servers[rec.Server]; srv != nil && (port == 0 || listensOn(srv, port)) {
		return srv, nil
	}
	if port != 0 {
		if name := serverOnPort(app, port); name != "" {
			return app.Servers[name], nil
		}
		return nil, fmt.Errorf("no http server listens on port %d, where this result was received", port)
	}
	return nil, fmt.Errorf("no http server named %q in the running config", rec.Server)
}

// serverOnPort names the server that listens on the TCP port, or "".
func serverOnPort(app *caddyhttp.App, port uint) string {
	names := make([]string, 0, len(app.Servers))
	for name := range app.Servers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if listensOn(app.Servers[name], port) {
			return name
		}
	}
	return ""
}

// listensOn reports whether one of srv's TCP listeners covers port.
func listensOn(srv *caddyhttp.Server, port uint) bool {
	for _, l := range srv.Listen {
		na, err := caddy.ParseNetworkAddress(l)
		if err != nil || na.IsUnixNetwork() || na.IsFdNetwork() {
			continue
		}
		if port >= na.StartPort && port <= na.EndPort {
			return true
		}
	}
	return false
}

// addrPort is the port of a host:port address, or 0.
func addrPort(hostport string) uint {
	_, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return 0
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return 0
	}
	return uint(n)
}

// rebuildRequest builds a server-side request equal to the stored one.
func rebuildRequest(ctx context.Context, rec *store.Record) (*http.Request, error) {
	sr := rec.Request
	u, err := url.ParseRequestURI(sr.URI)
	if err != nil {
		return nil, fmt.Errorf("stored request URI: %w", err)
	}
	proto := sr.Proto
	if proto == "" {
		proto = "HTTP/1.1"
	}
	major, minor, ok := http.ParseHTTPVersion(proto)
	if !ok {
		major, minor = 1, 1
	}
	req := &http.Request{
		Method:        sr.Method,
		URL:           u,
		Proto:         proto,
		ProtoMajor:    major,
		ProtoMinor:    minor,
		Header:        sr.Header.Clone(),
		Host:          sr.Host,
		RemoteAddr:    sr.RemoteAddr,
		RequestURI:    sr.URI,
		ContentLength: int64(len(sr.Body)),
		Body:          io.NopCloser(bytes.NewReader(sr.Body)),
		GetBody: func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(sr.Body)), nil
		},
	}
	if req.Header == nil {
		req.Header = make(http.Header)
	}
	if len(sr.Body) == 0 {
		req.Body = http.NoBody
	}
	if sr.TLS {
		req.TLS = &tls.ConnectionState{HandshakeComplete: true, ServerName: hostOnly(sr.Host)}
	}
	if cl := req.Header.Get("Content-Length"); cl != "" {
		req.Header.Set("Content-Length", strconv.Itoa(len(sr.Body)))
	}
	return req.WithContext(ctx), nil
}

// routeOf names a route for logs: host and path, without the query
// (which may hold a code).
func routeOf(host, uri string) string { return host + uriPath(uri) }

// uriPath is a request URI without its query, which may hold a code.
func uriPath(uri string) string {
	path, _, _ := strings.Cut(uri, "?")
	return path
}

func hostOnly(hostport string) string {
	if u, err := url.Parse("//" + hostport); err == nil {
		return u.Hostname()
	}
	return hostport
}

// serverForURL finds the http app's server that listens on u's port, where
// a pingback to u would arrive, and returns its name. It fails if no server
// of this Caddy does.
func (a *App) serverForURL(u *url.URL) (string, *caddyhttp.Server, error) {
	app, err := a.httpApp()
	if err != nil {
		return "", nil, err
	}
	port := urlPort(u)
	if name := serverOnPort(app, port); name != "" {
		return name, app.Servers[name], nil
	}
	return "", nil, fmt.Errorf("no server of this Caddy listens on port %d, so it does not serve the pingback URL %s://%s%s", port, u.Scheme, u.Host, u.EscapedPath())
}

// urlPort is u's port, 80 or 443 by default.
func urlPort(u *url.URL) uint {
	if p := addrPort(u.Host); p != 0 {
		return p
	}
	if u.Scheme == "https" {
		return 443
	}
	return 80
}

// probePingbackURL checks that a pingback to u, sent with method, would reach
// a pingback handler of this Caddy: it dispatches a probe through the server
// and route that serve u, and the pingback handler reports without
// forwarding anything to the app. Handlers placed before it on the route run
// as for any request.
//
// The answer is cached for the life of the config: the routes cannot change
// within it.
func (a *App) probePingbackURL(ctx context.Context, u *url.URL, method string) error {
	k := method + " " + u.String()
	if v, ok := a.probes.Load(k); ok {
		err, _ := v.(error)
		return err
	}
	err := a.probe(ctx, u, method)
	a.probes.Store(k, err)
	return err
}

func (a *App) probe(ctx context.Context, u *url.URL, method string) error {
	_, srv, err := a.serverForURL(u)
	if err != nil {
		return err
	}
	uri := u.RequestURI()
	req, err := rebuildRequest(ctx, &store.Record{Request: store.Request{
		Method: method, URI: uri, Host: u.Host, RemoteAddr: "127.0.0.1:0", TLS: u.Scheme == "https",
	}})
	if err != nil {
		return err
	}
	d := &dispatch{probe: true}
	req = req.WithContext(context.WithValue(req.Context(), dispatchCtxKey{}, d))
	serveRecovering(srv, req)
	if !d.reached {
		return fmt.Errorf("no pingback handler serves %s %s on this Caddy", method, u.Redacted())
	}
	return nil
}
