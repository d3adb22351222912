package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// API is the admin API's routes:
//
//	POST /pingback/tasks                             register a submitted task for fallback polling
//	GET  /pingback/tasks?provider=&state=&limit=&cursor=  list tracked tasks by pages (API.listTasks)
//	GET  /pingback/records?state=&provider=&received_after=&received_before=&limit=&cursor=
//	                                                 list stored results by pages (API.listRecords; the dead-letter queue: state=failed, rejected or parked)
//	GET  /pingback/records/<provider>/<id>           one stored result
//	DELETE /pingback/records/<provider>/<id>         purge one result (API.purgeRecord)
//	POST /pingback/purges                            purge the results a filter matches (API.purges)
//	POST /pingback/records/<provider>/<id>/replay     replay one result now, by hand (?force=true for a delivered one)
//	POST /pingback/records/<provider>/<id>/release    deliver one quarantined result now, by hand
//	GET  /pingback/tasks/<provider>/<id>             one tracked task (API.getTask)
//	GET  /pingback/status                            the overview (API.status)
//	POST /pingback/replays, GET|DELETE /pingback/replays/<id>  bulk replays (API.startReplays)
//	GET  /pingback/history?from=&to=                 the per-minute history (API.history)
//	GET  /pingback/deadletters                       parked, rejected and failed results grouped (API.deadLetters)
//	GET|POST /pingback/pauses, DELETE /pingback/pauses/<provider>  pauses of deliveries (API.pauses, API.resumePause)
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
//
// Each route answers for the Backend that Lookup returns (the running
// config's app) and 503 while there is none.
type API struct {
	lookup func() (Backend, error)
	state  func() *State
}

// NewAPI returns the routes. lookup returns the running config's Backend
// (an error while no pingback app runs: answered 503); state returns the
// process's State (nil while no pingback app holds one).
func NewAPI(lookup func() (Backend, error), state func() *State) *API {
	return &API{lookup: lookup, state: state}
}

// Routes returns the admin routes. Each answers 503 {"error": "starting:
// the store is opening"} while a pingback app is starting and no running
// config has an open store (API.startingError).
func (api *API) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/pingback/tasks", Handler: api.whileStarting(api.registerTask)},
		{Pattern: "/pingback/records", Handler: api.whileStarting(api.listRecords)},
		{Pattern: "/pingback/records/", Handler: api.whileStarting(api.record)},
		{Pattern: "/pingback/tasks/", Handler: api.whileStarting(api.getTask)},
		{Pattern: "/pingback/status", Handler: api.whileStarting(api.status)},
		{Pattern: "/pingback/replays", Handler: api.whileStarting(api.startReplays)},
		{Pattern: "/pingback/replays/", Handler: api.whileStarting(api.replayJob)},
		{Pattern: "/pingback/purges", Handler: api.whileStarting(api.purges)},
		{Pattern: "/pingback/history", Handler: api.whileStarting(api.history)},
		{Pattern: "/pingback/deadletters", Handler: api.whileStarting(api.deadLetters)},
		{Pattern: "/pingback/pauses", Handler: api.whileStarting(api.pauses)},
		{Pattern: "/pingback/pauses/", Handler: api.whileStarting(api.resumePause)},
	}
}

// backend returns the running Backend, or a 503 API error.
func (api *API) backend() (Backend, error) {
	b, err := api.lookup()
	if err != nil {
		return nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	return b, nil
}

// store returns the running Backend's store, or a 503 API error.
func (api *API) store() (Backend, store.Store, error) {
	b, err := api.backend()
	if err != nil {
		return nil, nil, err
	}
	st, err := b.Store()
	if err != nil {
		return nil, nil, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	return b, st, nil
}

// storeAPIError is the admin API's answer to a store operation that
// failed: 503 while the store is away (closed, unavailable, not open yet),
// 500 otherwise.
func storeAPIError(err error) error {
	var u Unavailable
	if errors.As(err, &u) || errors.Is(err, store.ErrUnavailable) || errors.Is(err, store.ErrClosed) {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
}

// BadInput is a caddy.APIError with status 400 and the formatted reason.
func BadInput(format string, args ...any) error {
	return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: fmt.Errorf(format, args...)}
}

// methodNotAllowed is the 405 of a method the route does not take; use
// says which it takes ("GET", "POST (or GET to list)").
func methodNotAllowed(r *http.Request, use string) error {
	return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use %s", r.Method, use)}
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

// writeJSON answers v as JSON with status 200.
func writeJSON(w http.ResponseWriter, v any) error {
	return writeJSONStatus(w, 0, v)
}

// writeJSONStatus answers v as JSON with status (0: 200, the default).
func writeJSONStatus(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	if status != 0 {
		w.WriteHeader(status)
	}
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
		return 0, BadInput("limit must be a whole number from 1 to 10000, got %q", v)
	}
	return n, nil
}

// knownProvider is nil for a provider the plugin knows, else the error
// naming the known ones (the provider check of a filter's Parse).
func knownProvider(name string) error {
	if _, ok := protocol.Lookup(name); !ok {
		return fmt.Errorf("unknown provider %q (known: %s)", name, protocol.NameList())
	}
	return nil
}

// canonicalKey is the store key of an id given in an admin path: the
// provider's canonical form of it (no leading zeros, CapSolver's UUIDs in
// lower case), or the id as given for an unknown provider or a malformed id.
func canonicalKey(provider, id string) store.Key {
	if p, ok := protocol.Lookup(provider); ok && p.ValidID(id) {
		id = p.CanonicalID(id)
	}
	return store.Key{Provider: provider, ID: id}
}
