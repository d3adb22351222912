package adminapi

import (
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// StatusAnswer is the body of GET /pingback/status.
type StatusAnswer struct {
	// Records is provider → state → stored results.
	Records map[string]map[store.State]int64 `json:"records"`
	// Tasks is provider → tracked tasks.
	Tasks map[string]TaskStatus `json:"tasks"`
	// OldestUndeliveredAgeSeconds is provider → age of the oldest result
	// in state failed or forwarding (0: none), as the gauge.
	OldestUndeliveredAgeSeconds map[string]float64 `json:"oldest_undelivered_age_seconds"`
	// LastCallbackAt is provider → when the last live pingback was stored,
	// from the store (it survives restarts; database-wide on PostgreSQL).
	LastCallbackAt map[string]time.Time `json:"last_callback_at"`
	// Budget is provider → the poller's res.php and getTaskResult budget,
	// the sum over the provider's accounts (Accounts has each one's).
	Budget map[string]BudgetStatus `json:"budget"`
	// Accounts is provider → account id → that account's budget and
	// tasks: every account of a configured api_key key, and every account
	// that has pending tasks (those of a key this Caddy does not have are
	// unpollable). Always present; {} when there is none.
	Accounts map[string]map[string]AccountStatus `json:"accounts"`
	// Loops is replay and poll: when each last ran a round in this
	// process, and when it runs next at the latest.
	Loops map[string]LoopStatus `json:"loops"`
	Store StoreStatus           `json:"store"`
	// Routes is route → its replay flow control in this process, for the
	// routes the replay loop holds back: paused, or with a replay
	// concurrency below the app's. A route is the host and path results
	// are forwarded to ("app.example/cb"). Always present; {} when no
	// route is held back. Per process: another instance on the same
	// PostgreSQL database keeps its own.
	Routes map[string]RouteStatus `json:"routes"`

	// Pauses are the pauses of deliveries in force, by provider ("*" for
	// every provider). Always present; [] when none.
	Pauses []Pause `json:"pauses"`
	// RouteHealth is route → its delivery health in this process: every
	// route forwarded to (live, replays, polled results) since the
	// process started. Always present; {} when none.
	RouteHealth map[string]RouteHealth `json:"route_health"`
	// Notifications are the last 50 events this process emitted, newest
	// first. Always present; [] when none.
	Notifications []Notification `json:"notifications"`
}

// RouteHealth is one route's delivery health in StatusAnswer.
type RouteHealth struct {
	// Provider is the provider of the route's last forward.
	Provider string `json:"provider"`
	// LastSuccess is when a forward to the route last succeeded (RFC
	// 3339, UTC); null when none did in this process.
	LastSuccess *time.Time `json:"last_success"`
	// FailingSince is the first failure of the route's current run of
	// failures; null while its last forward succeeded.
	FailingSince *time.Time `json:"failing_since"`
	// Failures is how many forwards to the route failed in a row.
	Failures int `json:"failures"`
}

// Notification is one event the plugin emitted, in StatusAnswer.
type Notification struct {
	Event    string `json:"event"`
	Provider string `json:"provider"`
	// Count is how many things the event stands for (1, or a summary's
	// count).
	Count int `json:"count"`
	// FirstAt and LastAt are when the first and last of them happened.
	FirstAt time.Time `json:"first_at"`
	LastAt  time.Time `json:"last_at"`
}

// RouteStatus is one route's replay flow control in StatusAnswer, set by
// the app's answers: a 429, or a 503 with Retry-After, pauses the route's
// replays and lowers its replay concurrency; successes raise it back.
type RouteStatus struct {
	// PausedUntil is when the route's replays resume (RFC 3339, UTC);
	// null when they are not paused.
	PausedUntil *time.Time `json:"paused_until"`
	// Concurrency is how many replays of the route may be in flight at
	// once now: from 1 up to Max.
	Concurrency int `json:"concurrency"`
	// Max is the app's replay concurrency (replay's concurrency), which
	// Concurrency rises back to.
	Max int `json:"max"`
}

// TaskStatus is one provider's tracked tasks in StatusAnswer.
type TaskStatus struct {
	Pending int64 `json:"pending"`
	// Unpollable is how many of the pending tasks were submitted with an
	// API key not in the provider's api_key: they are never polled, and
	// their results can only arrive by pingback.
	Unpollable int64 `json:"unpollable"`
	// OldestPendingAgeSeconds is the age of the oldest pending task
	// (since its submission); 0 when none is pending.
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
}

// BudgetStatus is one provider's res.php/getTaskResult budget in
// StatusAnswer: requests made, and requests left before the poller slows
// down (10 per tracked task plus the poller's allowance).
type BudgetStatus struct {
	Used int64 `json:"used"`
	Left int64 `json:"left"`
}

// AccountStatus is one account (one API key) of a provider in
// StatusAnswer.
type AccountStatus struct {
	// APIKeyEntry says which api_key entry the account is, never the key: the
	// entry's placeholder as written ("{env.CAPTCHA_KEY_B}"), or its
	// 1-based position ("api_key #2") for a key written in the config;
	// empty for an account this Caddy has no key for.
	APIKeyEntry string `json:"api_key_entry,omitempty"`
	// Used and Left are the account's res.php/getTaskResult budget, as
	// in BudgetStatus.
	Used int64 `json:"used"`
	Left int64 `json:"left"`
	// Pending is the account's pending tracked tasks.
	Pending int64 `json:"pending"`
	// Unpollable is the account's pending tasks that cannot be polled:
	// all of Pending for an account without a configured key, else 0.
	Unpollable int64 `json:"unpollable"`
}

// LoopStatus is one loop (replay or poll) in StatusAnswer; a time is
// absent while the loop has not run in this process.
type LoopStatus struct {
	LastRunAt time.Time `json:"last_run_at,omitzero"`
	NextRunAt time.Time `json:"next_run_at,omitzero"`
}

// StoreStatus is the store in StatusAnswer.
type StoreStatus struct {
	// Kind is the store module's name: badger or postgres.
	Kind string `json:"kind"`
	// Location is the Badger directory, or host:port/database.
	Location  string `json:"location"`
	Available bool   `json:"available"`
	// FreeBytes is the free space of the Badger directory's filesystem;
	// null for PostgreSQL (the database server's disk is not visible).
	FreeBytes *int64 `json:"free_bytes"`
}
