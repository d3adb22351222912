package admin

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// Backend is what the admin routes need of the running pingback app.
//
// Errors: a route answers an error that is a caddy.APIError as it is; one
// that wraps store.ErrNotFound or store.ErrPurged 404; a Conflict 409; one
// that wraps store.ErrUnavailable, store.ErrClosed or is an Unavailable
// 503; anything else 500 (each route's doc says which apply).
type Backend interface {
	// Ready reports whether the app's Start has run and opened its store.
	Ready() bool
	// Store returns the open store, waiting up to a second for a Start
	// that is opening it; an error saying why there is none otherwise.
	Store() (store.Store, error)
	// Now is the app's clock.
	Now() time.Time
	// Logger is the app's logger (bulk replays log on it).
	Logger() *zap.Logger

	// GiveUp is how long after its submission a task of provider is
	// polled (the global give_up for an unknown provider).
	GiveUp(provider string) time.Duration
	// RegisterTask tracks the task reg describes, submitted at submitted,
	// with the API api ("" for the provider's default); created is false
	// for a task already known (returned as stored). A bad registration
	// is a caddy.APIError with status 400.
	RegisterTask(ctx context.Context, reg adminapi.TaskRegistration, submitted time.Time, api protocol.API) (task *store.Task, created bool, err error)

	// ReplayResult replays one stored result now, by hand (force: even a
	// delivered one), and returns the record after the attempt.
	ReplayResult(ctx context.Context, key store.Key, force bool) (*store.Record, error)
	// ReleaseResult delivers one quarantined result now, by hand, and returns
	// the record after the attempt.
	ReleaseResult(ctx context.Context, key store.Key) (*store.Record, error)
	// PurgedResults is told that results of provider ("" for any) were purged
	// from st, so that what it derives from them (the quarantine's bytes)
	// is read again.
	PurgedResults(ctx context.Context, st store.Store, provider string)

	// JobContext is the context bulk replays run in: it ends when the app
	// stops (a reload or a stop cancels them).
	JobContext() context.Context
	// ReplayInSlots replays keys one by one in the replay loop's forward
	// slots (never more forwards in flight than its concurrency), each as
	// a bulk replay by hand, until ctx ends; done is called after each
	// attempt with whether the result was delivered. It returns once every
	// attempt it started has ended.
	ReplayInSlots(ctx context.Context, keys []store.Key, done func(delivered bool))

	// Status is the overview GET /pingback/status answers; its errors are
	// caddy.APIErrors.
	Status(ctx context.Context) (adminapi.StatusAnswer, error)

	// History is the per-minute history of [from, to) (whole minutes,
	// at most HistorySpan apart) that GET /pingback/history answers:
	// every instance's minute records merged, this process's figures not
	// yet written included.
	History(ctx context.Context, from, to time.Time) (adminapi.HistoryAnswer, error)
	// HistorySpan is the longest range History answers: the retention.
	HistorySpan() time.Duration
	// PutPause pauses the deliveries of p.Provider (store.PauseAll:
	// every provider) and returns the pause as stored; a provider the
	// config does not name is a caddy.APIError with status 400.
	PutPause(ctx context.Context, p store.Pause) (store.Pause, error)
	// DeletePause resumes provider (by: api, cli or console) and returns
	// the pause removed; store.ErrNotFound when it has none.
	DeletePause(ctx context.Context, provider, by string) (store.Pause, error)
	// ListPauses returns the pauses in force, by provider.
	ListPauses(ctx context.Context) ([]store.Pause, error)

	// PublicRecord and PublicTask are a record and a task as an admin
	// answer shows them: credential headers and pingback tokens redacted.
	PublicRecord(rec *store.Record) *store.Record
	PublicTask(t *store.Task) *store.Task
}

// Conflict marks a Backend error that the routes answer 409: the request
// conflicts with the result's state (delivered, in flight, quarantined,
// not quarantined, its provider paused). Its text is Err's.
type Conflict struct{ Err error }

func (c Conflict) Error() string { return c.Err.Error() }
func (c Conflict) Unwrap() error { return c.Err }

// Unavailable marks a Backend error that the routes answer 503: the store
// is away. Its text is Err's.
type Unavailable struct{ Err error }

func (u Unavailable) Error() string { return u.Err.Error() }
func (u Unavailable) Unwrap() error { return u.Err }
