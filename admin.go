package pingback

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI adds the plugin's routes to Caddy's admin endpoint:
//
//	POST /pingback/tasks                             register a submitted task for fallback polling
//	GET  /pingback/tasks?provider=&state=&limit=&cursor=  list tracked tasks by pages (admin_get.go)
//	GET  /pingback/records?state=&provider=&received_after=&received_before=&limit=&cursor=
//	                                                 list stored results by pages (admin_list.go; the dead-letter queue: state=failed, rejected or parked)
//	GET  /pingback/records/<provider>/<id>           one stored result
//	DELETE /pingback/records/<provider>/<id>         purge one result (admin_purge.go)
//	POST /pingback/purges                            purge the results a filter matches (admin_purge.go)
//	POST /pingback/records/<provider>/<id>/replay     replay one result now, by hand (?force=true for a delivered one)
//	POST /pingback/records/<provider>/<id>/release    deliver one quarantined result now, by hand
//	GET  /pingback/tasks/<provider>/<id>             one tracked task (admin_get.go)
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

// Routes returns the admin routes.
func (adminAPI) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/pingback/tasks", Handler: caddy.AdminHandlerFunc(handleRegisterTask)},
		{Pattern: "/pingback/records", Handler: caddy.AdminHandlerFunc(handleListRecords)},
		{Pattern: "/pingback/records/", Handler: caddy.AdminHandlerFunc(handleRecord)},
		{Pattern: "/pingback/tasks/", Handler: caddy.AdminHandlerFunc(handleGetTask)},
		{Pattern: "/pingback/status", Handler: caddy.AdminHandlerFunc(handleStatus)},
		{Pattern: "/pingback/replays", Handler: caddy.AdminHandlerFunc(handleStartReplays)},
		{Pattern: "/pingback/replays/", Handler: caddy.AdminHandlerFunc(handleReplayJob)},
		{Pattern: "/pingback/purges", Handler: caddy.AdminHandlerFunc(handlePurges)},
	}
}

func handleRegisterTask(w http.ResponseWriter, r *http.Request) error {
	if r.Method == http.MethodGet {
		return handleListTasks(w, r)
	}
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use POST (or GET to list)", r.Method)}
	}
	var reg adminapi.TaskRegistration
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&reg); err != nil {
		return badInput("decoding JSON body: %v", err)
	}
	switch {
	case reg.Provider == "":
		return badInput("provider is required")
	case reg.ID == "":
		return badInput("id is required")
	case reg.PingbackURL == "":
		return badInput("pingback_url is required")
	}
	a, err := activeApp()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	submitted := a.now()
	if reg.SubmittedAt != "" {
		submitted, err = time.Parse(time.RFC3339, reg.SubmittedAt)
		if err != nil {
			return badInput("submitted_at must be an RFC 3339 time: %v", err)
		}
		if err := checkSubmittedAt(submitted, a.now(), a.giveUpFor(reg.Provider)); err != nil {
			return badInput("%v", err)
		}
	}
	api := protocol.API(reg.API)
	if p, err := lookupProvider(reg.Provider); api == "" && err == nil && !p.Has(protocol.Legacy) {
		api = protocol.JSON
	}
	if api != "" && api != protocol.Legacy && api != protocol.JSON {
		return badInput("api must be legacy or json, got %q", reg.API)
	}
	task, created, err := a.trackTask(r.Context(), trackSpec{
		provider: reg.Provider, id: reg.ID, api: api, method: reg.Method,
		pingbackURL: reg.PingbackURL, submittedAt: submitted,
	}, true)
	var bad *badRequest
	if errors.As(err, &bad) {
		return badInput("%s", bad.reason)
	}
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(publicTask(task))
}

// handleRecord serves /pingback/records/<provider>/<id> (GET),
// /pingback/records/<provider>/<id>/replay (POST) and
// /pingback/records/<provider>/<id>/release (POST).
func handleRecord(w http.ResponseWriter, r *http.Request) error {
	parts := pathSegments(r, "/pingback/records/")
	switch {
	case len(parts) == 2 && parts[0] != "" && parts[1] != "" && r.Method == http.MethodDelete:
		return handlePurgeRecord(w, r, canonicalKey(parts[0], parts[1]))
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return handleGetRecord(w, r, canonicalKey(parts[0], parts[1]))
	case len(parts) != 3 || (parts[2] != "replay" && parts[2] != "release") || parts[0] == "" || parts[1] == "":
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found: use GET /pingback/records/<provider>/<id> or POST /pingback/records/<provider>/<id>/replay (or /release)")}
	}
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use POST", r.Method)}
	}
	key := canonicalKey(parts[0], parts[1])
	if parts[2] == "release" {
		return handleRelease(w, r, key)
	}
	force := false
	if v := r.URL.Query().Get("force"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return badInput("force must be true or false, got %q", v)
		}
		force = b
	}
	a, err := activeApp()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	rec, err := a.redrive(r.Context(), key, force, store.SourceManual)
	switch {
	case errors.Is(err, store.ErrPurged):
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("%s was purged: it cannot be replayed", key)}
	case errors.Is(err, store.ErrNotFound):
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no stored result %s", key)}
	case errors.Is(err, errDelivered):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("%s: %w", key, err)}
	case errors.Is(err, errInFlight), errors.Is(err, errQuarantined):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("%s: %w", key, err)}
	case err != nil:
		return storeAPIError(err)
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(publicRecord(rec))
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

// Interface guards
var _ caddy.AdminRouter = (*adminAPI)(nil)
