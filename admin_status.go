package pingback

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/store"
)

// statusAnswer is the body of GET /pingback/status.
type statusAnswer struct {
	// Records is provider → state → stored results.
	Records map[string]map[store.State]int64 `json:"records"`
	// Tasks is provider → tracked tasks.
	Tasks map[string]taskStatus `json:"tasks"`
	// OldestUndeliveredAgeSeconds is provider → age of the oldest result
	// in state failed or forwarding (0: none), as the gauge.
	OldestUndeliveredAgeSeconds map[string]float64 `json:"oldest_undelivered_age_seconds"`
	// LastCallbackAt is provider → when the last live pingback was stored,
	// from the store (it survives restarts; database-wide on PostgreSQL).
	LastCallbackAt map[string]time.Time `json:"last_callback_at"`
	// Budget is provider → the poller's res.php and getTaskResult budget.
	Budget map[string]budgetStatus `json:"budget"`
	// Loops is replay and poll: when each last ran a round in this
	// process, and when it runs next at the latest.
	Loops map[string]loopStatus `json:"loops"`
	Store storeStatus           `json:"store"`
}

type taskStatus struct {
	Pending int64 `json:"pending"`
	// OldestPendingAgeSeconds is the age of the oldest pending task
	// (since its submission); 0 when none is pending.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
}

type loopStatus struct {
	LastRunAt time.Time `json:"last_run_at,omitzero"`
	NextRunAt time.Time `json:"next_run_at,omitzero"`
}

type storeStatus struct {
	// Kind is the store module's name: badger or postgres.
	Kind string `json:"kind"`
	// Location is the Badger directory, or host:port/database.
	Location  string `json:"location"`
	Available bool   `json:"available"`
	// FreeBytes is the free space of the Badger directory's filesystem;
	// null for PostgreSQL (the database server's disk is not visible).
	FreeBytes *int64 `json:"free_bytes"`
}

// handleStatus answers GET /pingback/status: the overview (counts from
// store.Counter, never a scan of the records), 503 while the app or its
// store is not running.
func handleStatus(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET", r.Method)}
	}
	a, err := activeApp()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	st := a.store(time.Second)
	if st == nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errStoreUnavailable}
	}
	c, err := st.Counts(r.Context())
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the store's counts: %w", err)}
	}
	ages, ok := currentAges(r.Context(), st)
	if !ok {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errors.New("reading the store's ages failed")}
	}
	budget, err := a.pollBudgets(r.Context())
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the poll budget: %w", err)}
	}
	ans := statusAnswer{Records: c.Records, Tasks: map[string]taskStatus{}, Loops: map[string]loopStatus{},
		OldestUndeliveredAgeSeconds: map[string]float64{}, LastCallbackAt: ages.LastCallback, Budget: budget}
	if ans.Records == nil {
		ans.Records = map[string]map[store.State]int64{}
	}
	if ans.LastCallbackAt == nil {
		ans.LastCallbackAt = map[string]time.Time{}
	}
	now := a.now()
	for _, p := range countedProviders(c) {
		ans.Tasks[p] = taskStatus{Pending: c.TasksPending[p], OldestPendingAgeSeconds: roundAge(ageAt(ages.OldestPendingTask[p], now))}
		ans.OldestUndeliveredAgeSeconds[p] = roundAge(ageAt(ages.OldestUndelivered[p], now))
	}
	every := map[string]time.Duration{"replay": time.Second, "poll": time.Second}
	for loop, d := range every {
		ls := loopStatus{LastRunAt: loopRuns.get(loop).UTC()}
		if !ls.LastRunAt.IsZero() {
			ls.NextRunAt = ls.LastRunAt.Add(d)
		}
		ans.Loops[loop] = ls
	}
	kind := ""
	if m, ok := a.storeMod.(caddy.Module); ok {
		kind = m.CaddyModule().ID.Name()
	}
	ans.Store = storeStatus{Kind: kind, Location: a.name, Available: st.Available()}
	if _, ok := a.storeMod.(*BadgerStore); ok {
		if free, err := store.FreeBytes(a.dir); err == nil {
			ans.Store.FreeBytes = &free
		}
	}
	return writeJSON(w, ans)
}
