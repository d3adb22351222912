package pingback

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI adds the plugin's routes to Caddy's admin endpoint:
//
//	POST /pingback/tasks   register a submitted task for fallback polling
//
// The body is JSON: {"provider": "2captcha", "id": "123", "pingback_url":
// "https://example.com/pingback", "method": "userrecaptcha" (optional),
// "submitted_at": "2026-11-29T22:00:00Z" (optional, RFC 3339; default now)}.
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
	return []caddy.AdminRoute{{Pattern: "/pingback/tasks", Handler: caddy.AdminHandlerFunc(handleRegisterTask)}}
}

// taskRegistration is the body of POST /pingback/tasks.
type taskRegistration struct {
	Provider    string `json:"provider"`
	ID          string `json:"id"`
	PingbackURL string `json:"pingback_url"`
	Method      string `json:"method,omitempty"`
	SubmittedAt string `json:"submitted_at,omitempty"`
}

func handleRegisterTask(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use POST", r.Method)}
	}
	var reg taskRegistration
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
		if submitted.After(a.now().Add(time.Minute)) {
			return badInput("submitted_at is in the future")
		}
	}
	task, created, err := a.trackTask(r.Context(), reg.Provider, reg.ID, reg.Method, reg.PingbackURL, submitted, true)
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
	return json.NewEncoder(w).Encode(task)
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
