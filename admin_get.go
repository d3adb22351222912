package pingback

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// handleGetRecord answers GET /pingback/records/<provider>/<id>: the
// stored record as JSON (200), 404 for an unknown result, 503 while the
// store is not open.
func handleGetRecord(w http.ResponseWriter, r *http.Request, key store.Key) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET", r.Method)}
	}
	st, err := adminStore()
	if err != nil {
		return err
	}
	rec, err := st.Get(r.Context(), key)
	if errors.Is(err, store.ErrPurged) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("%s was purged", key)}
	}
	if errors.Is(err, store.ErrNotFound) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no stored result %s", key)}
	}
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	if rec.History == nil {
		rec.History = []store.Attempt{} // a list, [] for a result stored before the history was kept
	}
	return writeJSON(w, publicRecord(rec))
}

// handleGetTask answers GET /pingback/tasks/<provider>/<id>: the tracked
// task as JSON (200; result_at is set once its result arrived), 404 for an
// unknown task, 503 while the store is not open.
func handleGetTask(w http.ResponseWriter, r *http.Request) error {
	parts := pathSegments(r, "/pingback/tasks/")
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found: use GET /pingback/tasks/<provider>/<id>")}
	}
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET", r.Method)}
	}
	key := store.Key{Provider: parts[0], ID: parts[1]}
	st, err := adminStore()
	if err != nil {
		return err
	}
	t, err := st.GetTask(r.Context(), key)
	if errors.Is(err, store.ErrNotFound) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no tracked task %s", key)}
	}
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	return writeJSON(w, publicTask(t))
}

// handleListTasks answers GET /pingback/tasks?provider=&state=&limit=&cursor=:
// {"tasks": [...], "next_cursor": "..."}, ordered by submission time
// (submitted_at), then provider and id, at most limit (default 100, at
// most 10000); state is pending, done or expired; next_cursor, absent on
// the last page, asks for the next one. A cursor of the order before (by
// provider and id) answers 400.
func handleListTasks(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tq := store.TaskQuery{Provider: q.Get("provider"), State: store.TaskState(q.Get("state"))}
	if tq.Provider != "" {
		if _, err := lookupProvider(tq.Provider); err != nil {
			return badInput("%v", err)
		}
	}
	switch tq.State {
	case "", store.TaskPending, store.TaskDone, store.TaskExpired:
	default:
		return badInput("unknown task state %q (pending, done or expired)", tq.State)
	}
	limit, err := listLimit(q)
	if err != nil {
		return err
	}
	tq.Limit = limit
	if c := q.Get("cursor"); c != "" {
		pos, err := decodeTaskCursor(c)
		if err != nil {
			return badInput("%v", err)
		}
		tq.After = &pos
	}
	st, err := adminStore()
	if err != nil {
		return err
	}
	page, err := st.ListTaskPage(r.Context(), tq)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	ans := adminapi.TasksPage{Tasks: publicTasks(page.Tasks)}
	if ans.Tasks == nil {
		ans.Tasks = []*store.Task{}
	}
	if page.Next != nil {
		ans.NextCursor = encodeTaskCursor(*page.Next)
	}
	return writeJSON(w, ans)
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
