package pingback

import (
	"errors"
	"net/http"
	"sync"

	"github.com/caddyserver/caddy/v2"
)

// The start-up window: Caddy starts a config's apps one after the other in
// no fixed order, and makes the config active (caddy.ActiveContext) only
// once every app has started. Until then the admin API would find no
// running pingback app, and the HTTP server may already serve pingbacks
// while App.Start still opens the store (they wait for it: App.store).
// This file records the app whose Start is running, so that the admin API
// can say so.

// errStarting is the admin API's reason while the store is opening.
var errStarting = errors.New("starting: the store is opening")

// starting is the pingback app whose Start is running, or nil. Caddy loads
// one config at a time, so there is at most one.
var starting struct {
	mu  sync.Mutex
	app *App
}

// beginStarting records a as the app whose Start is running.
func (a *App) beginStarting() {
	starting.mu.Lock()
	defer starting.mu.Unlock()
	starting.app = a
}

// endStarting clears the record when a's Start returns, opened or not.
func (a *App) endStarting() {
	starting.mu.Lock()
	defer starting.mu.Unlock()
	if starting.app == a {
		starting.app = nil
	}
}

// startingError is the admin API's answer while a pingback app is starting
// and no running config has an open store: a caddy.APIError with status
// 503 and the reason "starting: the store is opening". It is nil otherwise:
// when no pingback app is starting (including after a Start that failed),
// and during a reload, while the running config's app and its open store
// keep answering.
func startingError() error {
	if v, err := caddy.ActiveContext().AppIfConfigured("pingback"); err == nil && v.(*App).readyHandle() != nil {
		return nil
	}
	starting.mu.Lock()
	a := starting.app
	starting.mu.Unlock()
	if a == nil {
		return nil
	}
	return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errStarting}
}

// whileStarting wraps an admin route's handler: it answers startingError
// while there is one, before the handler looks at the request.
func whileStarting(h caddy.AdminHandlerFunc) caddy.AdminHandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := startingError(); err != nil {
			return err
		}
		return h(w, r)
	}
}
