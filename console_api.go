package pingback

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"path"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2"
)

// The console's API is the admin API itself: <mount>/api/<route> is served
// by the handler of the admin route /pingback/<route>, in-process, with the
// same request (method, query, body) and the same answer, so every route
// the admin API has (or gains) works from the console. Two things differ:
// the console's guard runs first (console_guard.go), and credential
// headers of stored requests are removed from the answers.

// consoleRoutes maps admin route patterns to their handlers, matched the
// way Caddy's admin endpoint matches them (an http.ServeMux).
var consoleRoutes = sync.OnceValues(func() (*http.ServeMux, map[string]caddy.AdminHandler) {
	mux := http.NewServeMux()
	handlers := make(map[string]caddy.AdminHandler)
	for _, rt := range (adminAPI{}).Routes() {
		mux.Handle(rt.Pattern, http.NotFoundHandler()) // only its pattern is used
		handlers[rt.Pattern] = rt.Handler
	}
	return mux, handlers
})

// serveAPI answers <mount>/api/<rest> with the admin route /pingback/<rest>.
func (c *Console) serveAPI(w http.ResponseWriter, r *http.Request, rest string) error {
	w.Header().Set("Cache-Control", "no-store")
	if err := checkConsoleRequest(r); err != nil {
		return writeConsoleError(w, caddy.APIError{HTTPStatus: http.StatusForbidden, Err: err})
	}
	if a, err := activeApp(); err != nil || a != c.app {
		// The admin handlers answer for the running config; this console
		// belongs to one that is starting or stopping.
		return writeConsoleError(w, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable,
			Err: errors.New("the config is being reloaded: try again")})
	}
	ar := r.Clone(r.Context())
	ar.URL.Path, ar.URL.RawPath = "/pingback/"+rest, ""
	ar.RequestURI = ar.URL.RequestURI()
	mux, handlers := consoleRoutes()
	_, pattern := mux.Handler(ar)
	h, ok := handlers[pattern]
	if !ok || path.Clean(ar.URL.Path) != ar.URL.Path {
		return writeConsoleError(w, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("no admin route /pingback/" + rest)})
	}
	buf := &bufferedAnswer{header: make(http.Header)}
	if err := h.ServeHTTP(buf, ar); err != nil {
		return writeConsoleError(w, err)
	}
	body := buf.body.Bytes()
	if strings.HasPrefix(buf.header.Get("Content-Type"), "application/json") {
		body = redactCredentialHeaders(body)
	}
	for k, v := range buf.header {
		w.Header()[k] = v
	}
	if loc := w.Header().Get("Location"); strings.HasPrefix(loc, "/pingback/") {
		prefix := strings.TrimSuffix(originalRequest(r).URL.Path, r.URL.Path)
		w.Header().Set("Location", prefix+"/api/"+strings.TrimPrefix(loc, "/pingback/"))
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(buf.status())
	_, err := w.Write(body)
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

// bufferedAnswer holds an admin handler's answer, so that credential
// headers can be taken out of it before it is sent.
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

// credentialHeader reports whether a stored request header carries a
// credential the console must not show: Authorization, Proxy-Authorization,
// Cookie, Set-Cookie, and any name containing key, token, secret,
// password, session, signature or auth (X-Api-Key, X-Auth-Token...).
func credentialHeader(name string) bool {
	n := strings.ToLower(name)
	if n == "cookie" || n == "set-cookie" {
		return true
	}
	for _, s := range []string{"auth", "key", "token", "secret", "passw", "session", "signature"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// consoleHidden replaces a credential header's values in the console's
// answers.
const consoleHidden = "(hidden by the console)"

// redactCredentialHeaders replaces, in a JSON answer, the values of
// credential headers in every "header" object (a stored request's
// headers), wherever it sits, so that new answer shapes are covered too.
// An answer that is not JSON is returned unchanged.
func redactCredentialHeaders(body []byte) []byte {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || !redactIn(v) {
		return body
	}
	out, err := json.Marshal(v)
	if err != nil {
		return body
	}
	return append(out, '\n')
}

// redactIn redacts v in place and reports whether it changed anything.
func redactIn(v any) bool {
	changed := false
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if hdr, ok := e.(map[string]any); ok && strings.EqualFold(k, "header") {
				for name, vals := range hdr {
					if credentialHeader(name) {
						if _, isList := vals.([]any); isList {
							hdr[name] = []any{consoleHidden}
							changed = true
						}
					}
				}
			}
			changed = redactIn(e) || changed
		}
	case []any:
		for _, e := range x {
			changed = redactIn(e) || changed
		}
	}
	return changed
}
