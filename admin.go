package pingback

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/admin"
)

func init() {
	caddy.RegisterModule(adminAPI{})
}

// adminAPI adds the plugin's routes to Caddy's admin endpoint; package
// admin serves them (admin.API lists them and their answers) for the
// running config's pingback app.
type adminAPI struct{}

// CaddyModule returns the Caddy module information.
func (adminAPI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.pingback",
		New: func() caddy.Module { return new(adminAPI) },
	}
}

// Routes returns the admin routes. Each answers 503 {"error": "starting:
// the store is opening"} while the pingback app is starting and no running
// config has an open store ([App.beginStarting]).
func (adminAPI) Routes() []caddy.AdminRoute {
	return newAdminRoutes().Routes()
}

// newAdminRoutes returns the admin routes of the running config's app and
// the process's admin state.
func newAdminRoutes() *admin.API {
	return admin.NewAPI(activeBackend, processAdminState)
}

// activeBackend returns the pingback app of the running config: during a
// reload the config that runs, not the one being loaded.
func activeBackend() (admin.Backend, error) {
	a, err := activeApp()
	if err != nil {
		return nil, err
	}
	return a, nil
}

// activeApp returns the pingback app of the running config.
func activeApp() (*App, error) {
	v, err := caddy.ActiveContext().AppIfConfigured("pingback")
	if err != nil {
		return nil, fmt.Errorf("pingback app not running: %w", err)
	}
	return v.(*App), nil
}

// Interface guards
var (
	_ caddy.AdminRouter = (*adminAPI)(nil)
	_ admin.Backend     = (*App)(nil)
)
