package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// maxPauseReason bounds the reason of a pause, in bytes.
const maxPauseReason = 1000

// pauses answers /pingback/pauses: GET lists the pauses in force
// ({"pauses": [...]}, by provider); POST pauses a provider (API.putPause).
func (api *API) pauses(w http.ResponseWriter, r *http.Request) error {
	switch r.Method {
	case http.MethodGet:
		b, err := api.backend()
		if err != nil {
			return err
		}
		ps, err := b.ListPauses(r.Context())
		if err != nil {
			return storeAPIError(err)
		}
		return writeJSON(w, adminapi.PausesAnswer{Pauses: adminapi.PausesOf(ps)})
	case http.MethodPost:
		return api.putPause(w, r)
	}
	return methodNotAllowed(r, "GET or POST")
}

// putPause answers POST /pingback/pauses with an adminapi.PauseRequest:
// 200 with the pause as stored (a provider already paused keeps its since
// and by, and takes the new reason and until); 400 with a reason for bad
// input (no provider, one the config does not name, a malformed until or
// one not in the future, an unknown by, a reason over 1000 bytes), and
// nothing changes then; 503 while the store is away.
func (api *API) putPause(w http.ResponseWriter, r *http.Request) error {
	var req adminapi.PauseRequest
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return BadInput("body: want {\"provider\": \"<name>\" or \"*\", \"reason\", \"until\" (RFC 3339), \"by\"}: %v", err)
	}
	b, err := api.backend()
	if err != nil {
		return err
	}
	p, err := pauseOf(req, b.Now())
	if err != nil {
		return err
	}
	got, err := b.PutPause(r.Context(), p)
	var apiErr caddy.APIError
	switch {
	case errors.As(err, &apiErr):
		return err
	case err != nil:
		return storeAPIError(err)
	}
	return writeJSON(w, adminapi.PauseOf(got))
}

// pauseOf checks req at now and returns the pause it asks for, since now.
func pauseOf(req adminapi.PauseRequest, now time.Time) (store.Pause, error) {
	p := store.Pause{Provider: req.Provider, Reason: req.Reason, Since: now.UTC(), By: req.By}
	if p.By == "" {
		p.By = "api"
	}
	switch {
	case p.Provider == "":
		return store.Pause{}, BadInput("provider is required: a provider's name, or \"*\" for every provider")
	case p.By != "api" && p.By != "cli" && p.By != "console":
		return store.Pause{}, BadInput("by must be api, cli or console, got %q", req.By)
	case len(p.Reason) > maxPauseReason:
		return store.Pause{}, BadInput("reason is %d bytes long; at most %d", len(p.Reason), maxPauseReason)
	}
	if req.Until != "" {
		until, err := time.Parse(time.RFC3339, req.Until)
		if err != nil {
			return store.Pause{}, BadInput("until must be an RFC 3339 time such as 2026-12-01T18:00:00Z, got %q", req.Until)
		}
		if !until.After(now) {
			return store.Pause{}, BadInput("until %s is not in the future (now %s)", until.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		p.Until = until.UTC()
	}
	return p, nil
}

// resumePause answers DELETE /pingback/pauses/<provider> (or
// /pingback/pauses/* for the pause of every provider, which removes only
// that one; ?by=cli or console says who, default api): 200
// {"resumed": <the pause removed>}, 404 when the provider has no pause of
// its own, 503 while the store is away.
func (api *API) resumePause(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodDelete {
		return methodNotAllowed(r, "DELETE")
	}
	parts := pathSegments(r, "/pingback/pauses/")
	if len(parts) != 1 || parts[0] == "" {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found: use /pingback/pauses/<provider> or /pingback/pauses/*")}
	}
	by := r.URL.Query().Get("by")
	if by == "" {
		by = "api"
	}
	if by != "api" && by != "cli" && by != "console" {
		return BadInput("by must be api, cli or console, got %q", by)
	}
	b, err := api.backend()
	if err != nil {
		return err
	}
	p, err := b.DeletePause(r.Context(), parts[0], by)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("not paused: %s has no pause of its own", pauseTarget(parts[0]))}
	case err != nil:
		return storeAPIError(err)
	}
	return writeJSON(w, adminapi.ResumedAnswer{Resumed: adminapi.PauseOf(p)})
}

// pauseTarget names what a pause of provider holds, for a 404: "provider
// captchaai", or "every provider (*)".
func pauseTarget(provider string) string {
	if provider == store.PauseAll {
		return "every provider (*)"
	}
	return "provider " + provider
}

// pausedConflict is the Conflict of a bulk replay of provider ("": any
// provider) while it is paused: "*" holds every provider, and a provider
// of its own pause holds that one. Nil when nothing holds it.
func pausedConflict(ctx context.Context, b Backend, provider string) error {
	ps, err := b.ListPauses(ctx)
	if err != nil {
		return storeAPIError(err)
	}
	for _, p := range ps {
		if p.Provider == store.PauseAll || (provider != "" && p.Provider == provider) {
			return caddy.APIError{HTTPStatus: http.StatusConflict,
				Err: fmt.Errorf("%s is paused: nothing of it is delivered until it is resumed (DELETE /pingback/pauses/%s)", pauseSubject(provider, p.Provider), p.Provider)}
		}
	}
	return nil
}

func pauseSubject(provider, paused string) string {
	if paused == store.PauseAll || provider == "" {
		return "every provider"
	}
	return "provider " + strings.TrimSpace(provider)
}
