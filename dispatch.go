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
	app, err := a.httpApp()
	if err != nil {
		return outcome{class: retryable, status: http.StatusBadGateway, err: err}
	}
	direct, others := serverCandidates(app, rec.Server, addrPort(rec.Request.LocalAddr))
	if direct == "" && len(others) == 0 {
		return outcome{class: retryable, status: http.StatusBadGateway, err: errors.New("the running config has no http server")}
	}
	if direct != "" {
		if out, reached := a.serveStored(ctx, app.Servers[direct], rec, source, attempt); reached {
			return out
		} else if out.err != nil {
			return out // a handler before the pingback handler panicked
		}
	}
	// Not received here (another instance's port, or the route moved): the
	// first other server whose route for this host and path has a pingback
	// handler.
	for _, name := range others {
		if !a.probeRecord(ctx, app.Servers[name], rec) {
			continue
		}
		if out, reached := a.serveStored(ctx, app.Servers[name], rec, source, attempt); reached || out.err != nil {
			return out
		}
	}
	return outcome{class: retryable, status: http.StatusBadGateway,
		err: fmt.Errorf("no pingback handler took %s %s%s on server %q or any other (route changed?)", rec.Request.Method, rec.Request.Host, uriPath(rec.Request.URI), rec.Server)}
}

// serveStored dispatches rec through srv; reached says whether a pingback
// handler took it (and out is then its outcome). A handler before it that
// panicked gives reached false and an outcome with an error.
func (a *App) serveStored(ctx context.Context, srv *caddyhttp.Server, rec *store.Record, source store.Source, attempt int) (out outcome, reached bool) {
	req, err := rebuildRequest(ctx, rec)
	if err != nil {
		// A stored request that cannot be rebuilt never will be.
		return outcome{class: rejected, status: http.StatusBadRequest, err: err}, true
	}
	setDeliveryHeaders(req.Header, rec, source, attempt)
	d := new(dispatch)
	req = req.WithContext(context.WithValue(req.Context(), dispatchCtxKey{}, d))
	if v := serveRecovering(srv, req); v != nil && !d.reached {
		return outcome{class: retryable, err: fmt.Errorf("route aborted the replay: %v", v)}, false
	}
	return d.out, d.reached
}

// probeRecord reports whether a pingback handler on srv takes rec's
// request (nothing is forwarded).
func (a *App) probeRecord(ctx context.Context, srv *caddyhttp.Server, rec *store.Record) bool {
	req, err := rebuildRequest(ctx, rec)
	if err != nil {
		return false
	}
	d := &dispatch{probe: true}
	req = req.WithContext(context.WithValue(req.Context(), dispatchCtxKey{}, d))
	serveRecovering(srv, req)
	return d.reached
}

// serverCandidates orders the servers a stored request may go through.
// direct is dispatched to without a probe: the server named name if it
// listens on port (or port is unknown), else the one listening on port
// (the Caddyfile adapter names servers srv0, srv1, ... in order, so adding
// a site can move a name to another port), else the server named name (a
// request received by another instance, on a port this one does not
// listen on). others are the remaining servers, by name, to be probed for
// a pingback handler on the request's host and path.
func serverCandidates(app *caddyhttp.App, name string, port uint) (direct string, others []string) {
	switch srv := app.Servers[name]; {
	case srv != nil && (port == 0 || listensOn(srv, port)):
		direct = name
	case port != 0 && serverOnPort(app, port) != "":
		direct = serverOnPort(app, port)
	case srv != nil:
		direct = name
	}
	for _, n := range sortedServerNames(app) {
		if n != direct {
			others = append(others, n)
		}
	}
	return direct, others
}

func sortedServerNames(app *caddyhttp.App) []string {
	names := make([]string, 0, len(app.Servers))
	for name := range app.Servers {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
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

// serverOnPort names the server that listens on the TCP port, or "".
func serverOnPort(app *caddyhttp.App, port uint) string {
	for _, name := range sortedServerNames(app) {
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

// serverForURL names the http app's server that a pingback to u, sent
// with method, goes through: by the same rule as a stored result's
// dispatch (the server listening on u's port, else the first server whose
// route for u's host and path has a pingback handler), found with an
// in-process probe. It fails if no server of this Caddy serves u.
func (a *App) serverForURL(ctx context.Context, u *url.URL, method string) (string, error) {
	app, err := a.httpApp()
	if err != nil {
		return "", err
	}
	rec := &store.Record{Request: store.Request{
		Method: method, URI: u.RequestURI(), Host: u.Host, RemoteAddr: "127.0.0.1:0", TLS: u.Scheme == "https",
	}}
	direct, others := serverCandidates(app, "", urlPort(u))
	for _, name := range append([]string{direct}, others...) {
		if name != "" && a.probeRecord(ctx, app.Servers[name], rec) {
			return name, nil
		}
	}
	return "", fmt.Errorf("no pingback handler serves %s %s on this Caddy", method, u.Redacted())
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
// a pingback handler of this Caddy, and names the server it goes through:
// it dispatches a probe through the servers and routes that serve u (see
// serverForURL), and the pingback handler reports without forwarding
// anything to the app. Handlers placed before it on the route run as for
// any request.
//
// The answer is cached for the life of the config: the routes cannot change
// within it.
func (a *App) probePingbackURL(ctx context.Context, u *url.URL, method string) (string, error) {
	k := method + " " + u.String()
	if v, ok := a.probes.Load(k); ok {
		r := v.(probeResult)
		return r.server, r.err
	}
	name, err := a.serverForURL(ctx, u, method)
	a.probes.Store(k, probeResult{server: name, err: err})
	return name, err
}

// probeResult is a cached probe: the server's name, or why none serves.
type probeResult struct {
	server string
	err    error
}
