package pingback

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI adds the plugin's routes to Caddy's admin endpoint:
//
//	POST /pingback/tasks                             register a submitted task for fallback polling
//	GET  /pingback/tasks?provider=&state=&limit=&cursor=  list tracked tasks by pages (admin_tasks.go)
//	GET  /pingback/records?state=&provider=&received_after=&received_before=&limit=&cursor=
//	                                                 list stored results by pages (admin_records.go; the dead-letter queue: state=failed, rejected or parked)
//	GET  /pingback/records/<provider>/<id>           one stored result
//	DELETE /pingback/records/<provider>/<id>         purge one result (admin_purge.go)
//	POST /pingback/purges                            purge the results a filter matches (admin_purge.go)
//	POST /pingback/records/<provider>/<id>/replay     replay one result now, by hand (?force=true for a delivered one)
//	POST /pingback/records/<provider>/<id>/release    deliver one quarantined result now, by hand
//	GET  /pingback/tasks/<provider>/<id>             one tracked task (admin_tasks.go)
//	GET  /pingback/status                            the overview (admin_status.go)
//	POST /pingback/replays, GET|DELETE /pingback/replays/<id>  bulk replays (admin_replays.go)
//
// GET of one result answers the record (200) or 404 (saying so for a
// purged one). The replay route answers the
// record after the attempt (200), 404 for an unknown result, 409 while a
// forward of it is in flight, 409 for a quarantined one (release it), and
// 409 for a delivered result unless ?force=true (the app already has it),
// 503 while the store is unavailable. The release route answers like the
// replay route, and 409 for a result that is not quarantined.
//
// POST /pingback/tasks:
// The body is JSON: {"provider": "2captcha", "id": "123", "pingback_url":
// "https://example.com/pingback", "method": "userrecaptcha" (optional),
// "submitted_at": "2026-11-29T22:00:00Z" (optional, RFC 3339; default now;
// within [now - give_up, now], the provider's give_up, else 400)}.
// Answers: 201 with the task for a new task, 200 with the stored task if it
// was already known, 400 with {"error": "..."} for bad input (unknown
// provider, malformed id, a pingback URL that does not reach a pingback
// handler of this Caddy),
// 503 if the pingback app is not running.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.pingback",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes. Each answers 503 {"error": "starting:
// the store is opening"} while the pingback app is starting and no running
// config has an open store (startup.go).
func (adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/pingback/tasks", Handler: whileStarting(handleRegisterTask)},
		{Pattern: "/pingback/records", Handler: whileStarting(handleListRecords)},
		{Pattern: "/pingback/records/", Handler: whileStarting(handleRecord)},
		{Pattern: "/pingback/tasks/", Handler: whileStarting(handleGetTask)},
		{Pattern: "/pingback/status", Handler: whileStarting(handleStatus)},
		{Pattern: "/pingback/replays", Handler: whileStarting(handleStartReplays)},
		{Pattern: "/pingback/replays/", Handler: whileStarting(handleReplayJob)},
		{Pattern: "/pingback/purges", Handler: whileStarting(handlePurges)},
	}
}

// storeAPIError is the admin API's answer to a store operation that
// failed: 503 while the store is away (closed, unavailable, not open yet),
// 500 otherwise.
func storeAPIError(err error) error {
	if errors.Is(err, errStoreUnavailable) || errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrClosed) {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
}

// activeApp returns the pingback app of the running config.
func activeApp() (*App, error) {
	v, err := caddy.ActiveContext().AppIfConfigured("pingback")
	if err != nil {
		return nil, fmt.Errorf("pingback app not running: %w", err)
	}
	return v.(*App), nil
}

func badInput(format string, args ...any) error {
	return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf(format, args...)}
}

// pathSegments splits the admin request's path after prefix into its
// segments, on the escaped path (url.URL.EscapedPath), and unescapes each
// one: "%2F" inside a segment is part of it, not a separator, so
// /pingback/records/2captcha/a%2Fb names the id "a/b". A segment that does
// not unescape is returned as it is (no stored key has it).
func pathSegments(r *http.Request, prefix string) []string {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	if !ok {
		return nil
	}
	parts := strings.Split(rest, "/")
	for i, p := range parts {
		if u, err := url.PathUnescape(p); err == nil {
			parts[i] = u
		}
	}
	return parts
}

// adminStore returns the running app's store, or a 503 API error.
func adminStore() (store.Store, error) {
	a, err := activeApp()
	if err != nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	st := a.store(time.Second)
	if st == nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errStoreUnavailable}
	}
	return st, nil
}

// writeJSON answers v as JSON with status 200.
func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// listLimit reads limit: default 100, 1 to 10000.
func listLimit(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 10000 {
		return 0, badInput("limit must be a whole number from 1 to 10000, got %q", v)
	}
	return n, nil
}

// errBadCursor is the reason of a cursor this API did not give.
var errBadCursor = errors.New("cursor is not a next_cursor this API gave")

func encodeCursor(at time.Time, k store.Key) string {
	var ns int64
	if !at.IsZero() {
		ns = at.UnixNano()
	}
	b, _ := json.Marshal([]any{ns, k.Provider, k.ID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (time.Time, store.Key, error) {
	var parts []json.RawMessage
	var ns int64
	var k store.Key
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(b, &parts) != nil || len(parts) != 3 ||
		json.Unmarshal(parts[0], &ns) != nil || json.Unmarshal(parts[1], &k.Provider) != nil || json.Unmarshal(parts[2], &k.ID) != nil ||
		k.Provider == "" || k.ID == "" || ns < 0 {
		return time.Time{}, store.Key{}, errBadCursor
	}
	if ns == 0 {
		return time.Time{}, k, nil
	}
	return time.Unix(0, ns).UTC(), k, nil
}

// Interface guards
var _ caddy.AdminRouter = (*adminAPI)(nil)
