package pingback

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
	account, err := registrationAccount(a.providerConfig(reg.Provider), reg)
	if err != nil {
		return err
	}
	task, created, err := a.trackTask(r.Context(), trackSpec{
		provider: reg.Provider, id: reg.ID, api: api, method: reg.Method,
		pingbackURL: reg.PingbackURL, submittedAt: submitted, account: account,
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

// handleListTasks answers GET /pingback/tasks?provider=&state=&account=&limit=&cursor=:
// {"tasks": [...], "next_cursor": "..."}, ordered by submission time
// (submitted_at), then provider and id, at most limit (default 100, at
// most 10000); state is pending, done or expired; account is an account
// id (the tasks submitted with that API key); next_cursor, absent on
// the last page, asks for the next one. A cursor of the order before (by
// provider and id) answers 400.
func handleListTasks(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	tq := store.TaskQuery{Provider: q.Get("provider"), State: store.TaskState(q.Get("state")), Account: q.Get("account")}
	if tq.Account != "" && !validAccountID(tq.Account) {
		return badInput("account must be an account id of 16 hex characters, got %q", tq.Account)
	}
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

func encodeTaskCursor(p store.TaskPosition) string { return encodeCursor(p.SubmittedAt, p.Key) }

func decodeTaskCursor(s string) (store.TaskPosition, error) {
	at, k, err := decodeCursor(s)
	return store.TaskPosition{SubmittedAt: at, Key: k}, err
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

// giveUpFor is the provider's give_up (the global one for an unknown
// provider, which trackTask then refuses).
func (a *App) giveUpFor(provider string) time.Duration {
	if _, err := lookupProvider(provider); err != nil {
		return time.Duration(a.Poll.GiveUp)
	}
	return a.providerConfig(provider).giveUp
}

// registrationAccount returns the account a registered task belongs to:
// the one reg names, which must be a configured key's; with none named,
// the provider's only account. A provider with several keys needs one
// named (400), since polling with another account's key cannot find the
// task.
func registrationAccount(pc *ProviderConfig, reg adminapi.TaskRegistration) (string, error) {
	if reg.Account != "" {
		if _, ok := pc.account(reg.Account); !ok {
			return "", badInput("account %q is not one of provider %s's configured api_key accounts", reg.Account, reg.Provider)
		}
		return reg.Account, nil
	}
	if len(pc.accounts) > 1 {
		return "", badInput("account is required: provider %s has %d api_key accounts (see /pingback/status)", reg.Provider, len(pc.accounts))
	}
	if acc, ok := pc.onlyAccount(); ok {
		return acc.id, nil
	}
	return "", nil // no key: trackTask refuses it (strict)
}
