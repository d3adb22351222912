package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	// Account is the account id of the API key the task was submitted
	// with (see the provider's api_key): the root package's 16 hex
	// characters, never the key; empty when unknown (tasks stored without
	// one). It never contains '/': AddTask and UpdateTask refuse one that
	// does.
	Account string `json:"account,omitempty"`
}

// Key returns the task's key, the same as its result's.
func (t *Task) Key() Key { return Key{Provider: t.Provider, ID: t.ID} }

// TaskAccount returns the account the task was submitted with.
func (t *Task) TaskAccount() Account { return Account{Provider: t.Provider, ID: t.Account} }

// Account names one account of a provider: the provider's name and the
// account id of one of its API keys ("" for tasks stored without one).
type Account struct {
	Provider string
	ID       string
}

// String returns "<provider>/<id>".
func (a Account) String() string { return a.Provider + "/" + a.ID }

// DueQuery selects the tasks DueTasks returns.
type DueQuery struct {
	// Now is the time the tasks are due at: NextPollAt at or before it.
	Now time.Time
	// Limit is the most tasks returned (at least 1).
	Limit int
	// Accounts are the accounts whose tasks are returned (an account
	// listed twice counts once); none: the answer is empty.
	Accounts []Account
}

// Check refuses a query without a positive limit.
func (q *DueQuery) Check() error {
	if q.Limit < 1 {
		return fmt.Errorf("due tasks: limit %d, need at least 1", q.Limit)
	}
	return nil
}

// UniqueAccounts is q.Accounts without repeats, in their order.
func (q *DueQuery) UniqueAccounts() []Account {
	out := make([]Account, 0, len(q.Accounts))
	for _, a := range q.Accounts {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// CheckAccount refuses an account id the stores cannot key by.
func CheckAccount(t *Task) error {
	if strings.Contains(t.Account, "/") {
		return fmt.Errorf("task %s: account id %q contains '/'", t.Key(), t.Account)
	}
	return nil
}

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
	// DueTasks returns up to q.Limit pending tasks whose NextPollAt is at
	// or before q.Now and whose account (Provider, Account) is one of
	// q.Accounts, earliest NextPollAt first (then provider and id,
	// bytewise). Its cost is that of what it returns (and one index seek
	// per account), never that of the due tasks of other accounts (those
	// of another instance sharing the store, or submitted with keys this
	// one does not have). An error for q.Limit below 1.
	DueTasks(ctx context.Context, q DueQuery) ([]*Task, error)
	// ListTaskPage returns the first q.Limit tasks matching q after
	// q.After, ordered by submission time (SubmittedAt, Unix ns; a zero
	// time first), then provider, then id, bytewise, and the position to
	// continue from. A page costs what it holds, whatever the filters,
	// never a scan of every task.
	ListTaskPage(ctx context.Context, q TaskQuery) (TaskPage, error)
}
