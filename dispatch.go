package pingback

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"

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
func (a *App) dispatch(ctx context.Context, rec *store.Record, source string, attempt int) outcome {
	srv, err := a.server(rec.Server)
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
	srv.ServeHTTP(discardWriter{h: make(http.Header)}, req)
	if !d.reached {
		return outcome{class: retryable, status: http.StatusBadGateway,
			err: fmt.Errorf("no pingback handler took %s %s on server %q (route changed?)", rec.Request.Method, rec.Request.URI, rec.Server)}
	}
	return d.out
}

// server finds the http app's server by name.
func (a *App) server(name string) (*caddyhttp.Server, error) {
	v, err := a.ctx.AppIfConfigured("http")
	if err != nil {
		return nil, fmt.Errorf("http app: %w", err)
	}
	httpApp, ok := v.(*caddyhttp.App)
	if !ok {
		return nil, errors.New("http app has an unexpected type")
	}
	if srv := httpApp.Servers[name]; srv != nil {
		return srv, nil
	}
	return nil, fmt.Errorf("no http server named %q in the running config", name)
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

func hostOnly(hostport string) string {
	if u, err := url.Parse("//" + hostport); err == nil {
		return u.Hostname()
	}
	return hostport
}

// serverForURL names the http app's server that listens on u's port, where
// a pingback to u would arrive. It fails if no server of this Caddy does.
func (a *App) serverForURL(u *url.URL) (string, error) {
	v, err := a.ctx.AppIfConfigured("http")
	if err != nil {
		return "", fmt.Errorf("http app: %w", err)
	}
	httpApp, ok := v.(*caddyhttp.App)
	if !ok {
		return "", errors.New("http app has an unexpected type")
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", fmt.Errorf("pingback URL port %q: %w", port, err)
	}
	names := make([]string, 0, len(httpApp.Servers))
	for name := range httpApp.Servers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, l := range httpApp.Servers[name].Listen {
			na, err := caddy.ParseNetworkAddress(l)
			if err != nil || na.IsUnixNetwork() || na.IsFdNetwork() {
				continue
			}
			if uint(p) >= na.StartPort && uint(p) <= na.EndPort {
				return name, nil
			}
		}
	}
	return "", fmt.Errorf("no server of this Caddy listens on port %s, so it does not serve the pingback URL %s://%s%s", port, u.Scheme, u.Host, u.EscapedPath())
}

// probePingbackURL checks that a pingback to u, sent with method, would reach
// a pingback handler of this Caddy: it dispatches a probe through the server
// and route that serve u, and the pingback handler reports without
// forwarding anything to the app. Handlers placed before it on the route run
// as for any request.
func (a *App) probePingbackURL(ctx context.Context, u *url.URL, method string) error {
	name, err := a.serverForURL(u)
	if err != nil {
		return err
	}
	srv, err := a.server(name)
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
	srv.ServeHTTP(discardWriter{h: make(http.Header)}, req)
	if !d.reached {
		return fmt.Errorf("no pingback handler serves %s %s on this Caddy", method, u.Redacted())
	}
	return nil
}
