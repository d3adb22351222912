package admin

import (
	"errors"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2"
)

// State is the admin routes' state that outlives a config: whether a
// pingback app is starting, and the bulk replay jobs. The root package
// keeps one per process in a caddy.UsagePool entry that every started
// pingback app references until its cleanup, so that it survives a reload
// (the new config's app starts before the old one is cleaned up) and goes
// with the last app.
type State struct {
	mu       sync.Mutex
	starting int // pingback apps whose Start is running (Caddy loads one config at a time: 0 or 1)

	// Jobs are the bulk replays this process started.
	Jobs *Jobs
}

// NewState returns a State with no app starting and no job.
func NewState() *State { return &State{Jobs: NewJobs()} }

// BeginStart records that a pingback app's Start is running; EndStart,
// called when it returns (opened or not), ends that.
func (s *State) BeginStart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starting++
}

// EndStart ends what BeginStart began.
func (s *State) EndStart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starting--
}

// Starting reports whether a pingback app's Start is running.
func (s *State) Starting() bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starting > 0
}

// Destruct lets State be a caddy.UsagePool value: it holds nothing to
// close (the jobs end with the apps that run them).
func (s *State) Destruct() error { return nil }

// errStarting is the admin API's reason while the store is opening.
var errStarting = errors.New("starting: the store is opening")

// startingError is the admin API's answer while a pingback app is starting
// and no running config has an open store: a caddy.APIError with status
// 503 and the reason "starting: the store is opening". It is nil otherwise:
// when no pingback app is starting (including after a Start that failed),
// and during a reload, while the running config's app and its open store
// keep answering.
func (api *API) startingError() error {
	if b, err := api.lookup(); err == nil && b.Ready() {
		return nil
	}
	if !api.state().Starting() {
		return nil
	}
	return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errStarting}
}

// whileStarting wraps an admin route's handler: it answers startingError
// while there is one, before the handler looks at the request.
func (api *API) whileStarting(h caddy.AdminHandlerFunc) caddy.AdminHandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := api.startingError(); err != nil {
			return err
		}
		return h(w, r)
	}
}

// Interface guards
var _ caddy.Destructor = (*State)(nil)
