package store

import (
	"context"
	"time"
)

// TaskState is where a tracked task stands.
type TaskState string

// The states of a task.
const (
	// TaskPending: submitted, no result yet; polled from NextPollAt on.
	TaskPending TaskState = "pending"
	// TaskDone: a result is stored (by pingback, poll or a res.php answer
	// seen by the track handler).
	TaskDone TaskState = "done"
	// TaskExpired: no result before give_up (or the provider no longer
	// knows the id); never polled again.
	TaskExpired TaskState = "expired"
)

// Task is a submitted task the plugin knows about, so that the poller can
// recover its result if the pingback never comes. Times are UTC.
type Task struct {
	Provider string `json:"provider"`
	ID       string `json:"id"`
	// Method is in.php's method (userrecaptcha, post, ...) or createTask's
	// task type (RecaptchaV2TaskProxyless, ...); empty if unknown.
	Method string `json:"method,omitempty"`
	// API is the API family the task was submitted through: "" or
	// "legacy" (in.php, polled with res.php) or "json" (createTask,
	// polled with getTaskResult).
	API         string    `json:"api,omitempty"`
	SubmittedAt time.Time `json:"submitted_at"`
	// PingbackURL is where the result is delivered: the pingback URL the
	// submission carried (or the one the plugin added).
	PingbackURL string `json:"pingback_url"`
	// Server is the name of the http app's server that serves the
	// pingback URL (in the config that tracked the task): polled results
	// are dispatched through the server of that name, then by host and
	// path. Empty for tasks stored before it was recorded.
	Server string    `json:"server,omitempty"`
	State  TaskState `json:"state"`
	// NextPollAt is when the poller asks res.php next; zero means never.
	NextPollAt time.Time `json:"next_poll_at,omitzero"`
	// Polls counts res.php or getTaskResult requests the poller spent on
	// this task.
	Polls int `json:"polls,omitempty"`
	// AppPolls counts the app's own getTaskResult requests for this task
	// seen by pingback_track, and AppPolledAt is the last one's time
	// (counted for providers that limit calls per task).
	AppPolls    int       `json:"app_polls,omitempty"`
	AppPolledAt time.Time `json:"app_polled_at,omitzero"`
	LastError   string    `json:"last_error,omitempty"`
	// ResultAt is when the task's result arrived (the received time of
	// the result stored under its key, by pingback or poll); zero while
	// none has. The drill measures submit-to-result delays with it.
	ResultAt  time.Time `json:"result_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at"`
	ExpiresAt time.Time `json:"expires_at"`
	// Token is the task's pingback token: the random value pingback_track
	// added to the pingback URL's query (as pingback_token) in the
	// submission; a pingback for the task must carry it. Empty for a task
	// without one (registered by hand, tracked before tokens, or a GET
	// submission whose pingback URL has a query of its own).
	Token string `json:"token,omitempty"`
}

// Key returns the task's key, the same as its result's.
func (t *Task) Key() Key { return Key{Provider: t.Provider, ID: t.ID} }

// TaskStore is the part of the store that tracks submitted tasks. Writes
// follow the Store contract: durable on success, indexes in step.
type TaskStore interface {
	// AddTask stores t unless a task with the same key exists, in which
	// case it returns the existing one. If a result for the key is already
	// stored, was received at or after t.SubmittedAt and is not
	// quarantined, t is stored as TaskDone and not scheduled.
	AddTask(ctx context.Context, t *Task) (existing *Task, err error)
	// GetTask returns the task under key, or ErrNotFound.
	GetTask(ctx context.Context, key Key) (*Task, error)
	// UpdateTask atomically applies fn to the task under key, like Update.
	UpdateTask(ctx context.Context, key Key, fn func(*Task) error) (*Task, error)
	// DueTasks returns up to limit pending tasks whose NextPollAt is at or
	// before now, earliest first.
	DueTasks(ctx context.Context, now time.Time, limit int) ([]*Task, error)
	// ListTaskPage returns the first q.Limit tasks matching q after
	// q.After, ordered by submission time (SubmittedAt, Unix ns; a zero
	// time first), then provider, then id, bytewise, and the position to
	// continue from. A page costs what it holds, whatever the filters,
	// never a scan of every task.
	ListTaskPage(ctx context.Context, q TaskQuery) (TaskPage, error)
}
