package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// maxBulkReplay is the most results one job replays; a filter matching
// more replays the first ones in the store's list order.
const maxBulkReplay = 100000

var errNoJob = errors.New("no such bulk replay in this process (jobs live in the instance that started them)")

// startReplays answers POST /pingback/replays: the body is a JSON filter
// {"provider", "state" (default "parked"), "received_after",
// "received_before"} (RFC 3339 times); it starts a bulk replay and
// answers 202 {"id", "status": "running", ...} with a Location header,
// 400 for a bad filter, 409 while the filter's provider (any provider,
// while "*" is) is paused, 503 while the store is not open.
func (api *API) startReplays(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return methodNotAllowed(r, "POST")
	}
	f, err := decodeFilter(r, store.StateParked)
	if err != nil {
		return err
	}
	if f.State == store.StateDelivered || f.State == store.StateForwarding || f.State == store.StateQuarantined {
		return BadInput("state %s cannot be replayed in bulk (use failed, rejected, parked, expired or queued; quarantined results are released one by one)", f.State)
	}
	b, err := api.backend()
	if err != nil {
		return err
	}
	if err := pausedConflict(r.Context(), b, f.Provider); err != nil {
		return err
	}
	j, err := api.startBulkReplay(r.Context(), b, f)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	s := j.snapshot()
	w.Header().Set("Location", "/pingback/replays/"+s.ID)
	return writeJSONStatus(w, http.StatusAccepted, s)
}

// replayJob answers GET /pingback/replays/<id> (the job's progress) and
// DELETE (cancels it; answers the job), 404 for a job this process does
// not know.
func (api *API) replayJob(w http.ResponseWriter, r *http.Request) error {
	id := strings.TrimPrefix(r.URL.Path, "/pingback/replays/")
	if id == "" || strings.Contains(id, "/") {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("not found: use /pingback/replays/<id>")}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		return methodNotAllowed(r, "GET or DELETE")
	}
	var j *replayJob
	if s := api.state(); s != nil {
		j = s.Jobs.lookup(id)
	}
	if j == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("bulk replay %s: %w", id, errNoJob)}
	}
	if r.Method == http.MethodDelete {
		j.cancel()
	}
	return writeJSON(w, j.snapshot())
}

// startBulkReplay lists the matching results and starts the job, in the
// process's State (held by the running app b).
func (api *API) startBulkReplay(ctx context.Context, b Backend, f adminapi.ReplayFilter) (*replayJob, error) {
	st, err := b.Store()
	if err != nil {
		return nil, err
	}
	jobs := api.state()
	if jobs == nil {
		return nil, Unavailable{Err: errors.New("pingback app not running")}
	}
	recs, err := st.List(ctx, store.Filter{Provider: f.Provider, State: f.State}, maxBulkReplay)
	if err != nil {
		return nil, err
	}
	var keys []store.Key
	for _, r := range recs {
		if f.Matches(r) {
			keys = append(keys, r.Key())
		}
	}
	j, jctx := jobs.Jobs.add(b.JobContext(), len(keys)) // a reload or stop cancels it
	b.Logger().Info("bulk replay started", zap.String("job", j.state.ID), zap.Int("matched", len(keys)),
		zap.String("provider", f.Provider), zap.String("state", string(f.State)))
	go runBulkReplay(jctx, b, jobs.Jobs, j, keys)
	return j, nil
}

// runBulkReplay replays keys, each in a forward slot of the replay loop.
func runBulkReplay(ctx context.Context, b Backend, jobs *Jobs, j *replayJob, keys []store.Key) {
	b.ReplayInSlots(ctx, keys, func(delivered bool) {
		j.update(func(s *adminapi.ReplayJobState) {
			s.Done++
			if delivered {
				s.Delivered++
			} else {
				s.Failed++
			}
		})
	})
	status := "done"
	if ctx.Err() != nil {
		status = "cancelled"
	}
	j.update(func(s *adminapi.ReplayJobState) { s.Status = status })
	j.cancel()
	jobs.end(j)
	s := j.snapshot()
	b.Logger().Info("bulk replay ended", zap.String("job", s.ID), zap.String("status", s.Status),
		zap.Int("matched", s.Matched), zap.Int("delivered", s.Delivered), zap.Int("failed", s.Failed))
}
