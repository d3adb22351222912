package pingback

import (
	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/admin"
)

// The start-up window: Caddy starts a config's apps one after the other in
// no fixed order, and makes the config active (caddy.ActiveContext) only
// once every app has started. Until then the admin API would find no
// running pingback app, and the HTTP server may already serve pingbacks
// while App.Start still opens the store (they wait for it: App.store).
// The app whose Start is running says so in the process's admin.State, so
// that the admin API can answer 503 "starting: the store is opening".
//
// Who owns that record, and the bulk replay jobs beside it: the admin
// routes and the app cannot reach each other during a load (Caddy
// provisions admin.api modules with New and Provision, outside any
// config's module tree and with no cleanup, before the new config's apps
// are provisioned, and the config becomes active only once they have all
// started), and the jobs must outlive the config that started them (a
// reload keeps answering them). So the record is an entry of a
// caddy.UsagePool, Caddy's pattern for what outlives a config: every
// pingback app takes a reference when its Start begins and gives it back
// at its Cleanup, so the entry lives from the first app's start to the
// last app's cleanup (a reload starts the new app before cleaning up the
// old one), and two tests, or two Caddy runs in one process, do not see
// each other's jobs once the apps are gone. The admin routes only read
// the entry (processAdminState), holding no reference of their own.

// adminStates holds the process's admin.State under adminStateKey.
var adminStates = caddy.NewUsagePool()

const adminStateKey = "pingback.admin"

// beginStarting takes a's reference to the process's admin.State and
// records that a's Start is running.
func (a *App) beginStarting() {
	v, _, _ := adminStates.LoadOrNew(adminStateKey, func() (caddy.Destructor, error) { return admin.NewState(), nil })
	a.adminState = v.(*admin.State)
	a.adminState.BeginStart()
}

// endStarting ends the record when a's Start returns, opened or not.
func (a *App) endStarting() {
	a.adminState.EndStart()
}

// releaseAdminState gives back a's reference to the admin.State (at
// Cleanup; nothing if Start never ran).
func (a *App) releaseAdminState() {
	if a.adminState == nil {
		return
	}
	a.adminState = nil
	_, _ = adminStates.Delete(adminStateKey)
}

// processAdminState returns the process's admin.State, nil while no
// pingback app holds one, without taking a reference.
func processAdminState() *admin.State {
	var s *admin.State
	adminStates.Range(func(_, v any) bool {
		s = v.(*admin.State)
		return false
	})
	return s
}
