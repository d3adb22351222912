package pingback

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/store"
)

// handleStartReplays answers POST /pingback/replays: the body is a JSON
// filter {"provider", "state" (default "parked"), "received_after",
// "received_before"} (RFC 3339 times); it starts a bulk replay and
// answers 202 {"id", "status": "running", ...} with a Location header,
// 400 for a bad filter, 503 while the store is not open.
func handleStartReplays(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use POST", r.Method)}
	}
	f, err := decodeFilter(r, store.StateParked)
	if err != nil {
		return err
	}
	if f.State == store.StateDelivered || f.State == store.StateForwarding || f.State == store.StateQuarantined {
		return badInput("state %s cannot be replayed in bulk (use failed, rejected, parked or queued; quarantined results are released one by one)", f.State)
	}
	a, err := activeApp()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	j, err := a.startBulkReplay(r.Context(), f)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	s := j.snapshot()
	w.Header().Set("Location", "/pingback/replays/"+s.ID)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	return json.NewEncoder(w).Encode(s)
}

// handleReplayJob answers GET /pingback/replays/<id> (the job's progress)
// and DELETE (cancels it; answers the job), 404 for a job this process
// does not know.
func handleReplayJob(w http.ResponseWriter, r *http.Request) error {
	id := strings.TrimPrefix(r.URL.Path, "/pingback/replays/")
	if id == "" || strings.Contains(id, "/") {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("not found: use /pingback/replays/<id>")}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET or DELETE", r.Method)}
	}
	j := lookupReplayJob(id)
	if j == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("bulk replay %s: %w", id, errNoJob)}
	}
	if r.Method == http.MethodDelete {
		j.cancel()
	}
	return writeJSON(w, j.snapshot())
}
