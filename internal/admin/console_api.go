package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"path"
	"strings"

	"github.com/caddyserver/caddy/v2"
)

// serveAPI answers <mount>/api/<rest> with the admin route /pingback/<rest>.
//
// The console's API is the admin API itself: <mount>/api/<route> is served
// by the handler of the admin route /pingback/<route>, in-process, with the
// same request (method, query, body) and the same answer, so every route
// the admin API has (or gains) works from the console, with credential
// headers and pingback tokens of stored requests redacted as the admin
// API redacts them (Backend.PublicRecord), and tasks without their token
// (Backend.PublicTask). Only the console's guard (Console.checkRequest)
// comes first.
func (c *Console) serveAPI(w http.ResponseWriter, r *http.Request, rest string) error {
	w.Header().Set("Cache-Control", "no-store")
	if err := c.checkRequest(r); err != nil {
		return writeConsoleError(w, caddy.APIError{HTTPStatus: http.StatusForbidden, Err: err})
	}
	if b, err := c.api.lookup(); err != nil || b != c.backend {
		// The admin handlers answer for the running config; this console
		// belongs to one that is starting or stopping.
		return writeConsoleError(w, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable,
			Err: errors.New("the config is being reloaded: try again")})
	}
	ar := r.Clone(r.Context())
	// The escaped path too: the admin handlers split it (pathSegments), so
	// that an id with "%2F" stays one segment.
	ar.URL.Path = "/pingback/" + rest
	ar.URL.RawPath = "/pingback/" + strings.TrimPrefix(r.URL.EscapedPath(), "/api/")
	ar.RequestURI = ar.URL.RequestURI()
	_, pattern := c.routes.Handler(ar)
	h, ok := c.handlers[pattern]
	if !ok || path.Clean(ar.URL.Path) != ar.URL.Path {
		return writeConsoleError(w, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no admin route /pingback/" + rest)})
	}
	buf := &bufferedAnswer{header: make(http.Header)}
	if err := h.ServeHTTP(buf, ar); err != nil {
		return writeConsoleError(w, err)
	}
	for k, v := range buf.header {
		w.Header()[k] = v
	}
	if loc := w.Header().Get("Location"); strings.HasPrefix(loc, "/pingback/") {
		prefix := strings.TrimSuffix(c.original(r).URL.Path, r.URL.Path)
		w.Header().Set("Location", prefix+"/api/"+strings.TrimPrefix(loc, "/pingback/"))
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(buf.status())
	_, err := w.Write(buf.body.Bytes())
	return err
}

// writeConsoleError answers err as Caddy's admin endpoint does: the
// APIError's status (500 for other errors) and {"error": "..."}.
func writeConsoleError(w http.ResponseWriter, err error) error {
	var apiErr caddy.APIError
	if !errors.As(err, &apiErr) {
		apiErr = caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	if apiErr.HTTPStatus == 0 {
		apiErr.HTTPStatus = http.StatusInternalServerError
	}
	if apiErr.Message == "" && apiErr.Err != nil {
		apiErr.Message = apiErr.Err.Error()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(apiErr.HTTPStatus)
	return json.NewEncoder(w).Encode(apiErr)
}

// bufferedAnswer holds an admin handler's answer, so that an error
// returned after nothing was written can still be answered, and a
// Location header rewritten, before anything is sent.
type bufferedAnswer struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (b *bufferedAnswer) Header() http.Header { return b.header }

func (b *bufferedAnswer) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedAnswer) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}

func (b *bufferedAnswer) status() int {
	if b.code == 0 {
		return http.StatusOK
	}
	return b.code
}
