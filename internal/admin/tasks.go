package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// registerTask answers POST /pingback/tasks (see API) and, for GET, lists
// the tasks (API.listTasks).
func (api *API) registerTask(w http.ResponseWriter, r *http.Request) error {
	if r.Method == http.MethodGet {
		return api.listTasks(w, r)
	}
	if r.Method != http.MethodPost {
		return methodNotAllowed(r, "POST (or GET to list)")
	}
	var reg adminapi.TaskRegistration
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&reg); err != nil {
		return BadInput("decoding JSON body: %v", err)
	}
	switch {
	case reg.Provider == "":
		return BadInput("provider is required")
	case reg.ID == "":
		return BadInput("id is required")
	case reg.PingbackURL == "":
		return BadInput("pingback_url is required")
	}
	b, err := api.backend()
	if err != nil {
		return err
	}
	submitted := b.Now()
	if reg.SubmittedAt != "" {
		submitted, err = time.Parse(time.RFC3339, reg.SubmittedAt)
		if err != nil {
			return BadInput("submitted_at must be an RFC 3339 time: %v", err)
		}
		if err := checkSubmittedAt(submitted, b.Now(), b.GiveUp(reg.Provider)); err != nil {
			return BadInput("%v", err)
		}
	}
	api2 := protocol.API(reg.API)
	if p, ok := protocol.Lookup(reg.Provider); api2 == "" && ok && !p.Has(protocol.Legacy) {
		api2 = protocol.JSON
	}
	if api2 != "" && api2 != protocol.Legacy && api2 != protocol.JSON {
		return BadInput("api must be legacy or json, got %q", reg.API)
	}
	task, created, err := b.RegisterTask(r.Context(), reg, submitted, api2)
	var apiErr caddy.APIError
	if errors.As(err, &apiErr) {
		return err
	}
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return writeJSONStatus(w, status, b.PublicTask(task))
}

// getTask answers GET /pingback/tasks/<provider>/<id>: the tracked task
// as JSON (200; result_at is set once its result arrived), 404 for an
// unknown task, 503 while the store is not open.
func (api *API) getTask(w http.ResponseWriter, r *http.Request) error {
	parts := pathSegments(r, "/pingback/tasks/")
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found: use GET /pingback/tasks/<provider>/<id>")}
	}
	if r.Method != http.MethodGet {
		return methodNotAllowed(r, "GET")
	}
	key := store.Key{Provider: parts[0], ID: parts[1]}
	b, st, err := api.store()
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
	return writeJSON(w, b.PublicTask(t))
}

// listTasks answers GET /pingback/tasks?provider=&state=&account=&limit=&cursor=:
// {"tasks": [...], "next_cursor": "..."}, ordered by submission time
// (submitted_at), then provider and id, at most limit (default 100, at
// most 10000); state is pending, done or expired; account is an account
// id (the tasks submitted with that API key); next_cursor, absent on
// the last page, asks for the next one. A cursor of the order before (by
// provider and id) answers 400.
func (api *API) listTasks(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tq := store.TaskQuery{Provider: q.Get("provider"), State: store.TaskState(q.Get("state")), Account: q.Get("account")}
	if tq.Account != "" && !validAccountID(tq.Account) {
		return BadInput("account must be an account id of 16 hex characters, got %q", tq.Account)
	}
	if tq.Provider != "" {
		if err := knownProvider(tq.Provider); err != nil {
			return BadInput("%v", err)
		}
	}
	switch tq.State {
	case "", store.TaskPending, store.TaskDone, store.TaskExpired:
	default:
		return BadInput("unknown task state %q (pending, done or expired)", tq.State)
	}
	limit, err := listLimit(q)
	if err != nil {
		return err
	}
	tq.Limit = limit
	if c := q.Get("cursor"); c != "" {
		pos, err := decodeTaskCursor(c)
		if err != nil {
			return BadInput("%v", err)
		}
		tq.After = &pos
	}
	b, st, err := api.store()
	if err != nil {
		return err
	}
	page, err := st.ListTaskPage(r.Context(), tq)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	ans := adminapi.TasksPage{Tasks: make([]*store.Task, len(page.Tasks))}
	for i, t := range page.Tasks {
		ans.Tasks[i] = b.PublicTask(t)
	}
	if page.Next != nil {
		ans.NextCursor = encodeTaskCursor(*page.Next)
	}
	return writeJSON(w, ans)
}

// validAccountID reports whether s has an account id's shape: 16
// lower-case hex characters.
func validAccountID(s string) bool {
	if len(s) != 16 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// checkSubmittedAt refuses a registered task's submitted_at outside
// [now - giveUp, now]: a task submitted later than now does not exist yet,
// and one submitted before its give_up would be expired at once (and a
// time near year 1 or 1970 would make the store's expiry wrap).
func checkSubmittedAt(submitted, now time.Time, giveUp time.Duration) error {
	switch {
	case submitted.After(now):
		return fmt.Errorf("submitted_at %s is in the future (now %s)", submitted.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	case submitted.Before(now.Add(-giveUp)):
		return fmt.Errorf("submitted_at %s is older than give_up (%s): the task would be expired at once", submitted.UTC().Format(time.RFC3339), giveUp)
	}
	return nil
}
