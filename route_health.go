package pingback

import (
	"sync"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
)

// DefaultFailingAfter is how long a route fails before
// pingback_route_failing is emitted, when notify's failing_after is unset.
const DefaultFailingAfter = 10 * time.Minute

// maxHealthRoutes bounds the routes whose health is kept (a route comes
// from a request's Host): beyond it, a new route takes the place of the
// healthy one that succeeded longest ago, or is not tracked.
const maxHealthRoutes = 256

// routeHealth is every route's delivery health in this process, from
// every forward's outcome (live, replays and polled results): when it last
// succeeded and since when it fails. It belongs to the store handle, so it
// outlives reloads. The zero value is ready to use.
type routeHealth struct {
	mu     sync.Mutex
	routes map[string]*routeHealthState
}

// routeHealthState is one route's health.
type routeHealthState struct {
	provider     string    // the provider of its last forward
	lastSuccess  time.Time // zero: none in this process
	failingSince time.Time // the first failure of the current run; zero while it succeeds
	failures     int       // forwards failed in a row
	reported     bool      // pingback_route_failing was emitted for the current run
}

// noteRouteHealth applies one forward's outcome to its route's health:
// a delivery ends a run of failures (emitting pingback_route_recovered if
// the run was reported failing), a failure or a rejection extends it; a
// forward cut short says nothing about the route.
func (a *App) noteRouteHealth(d delivery, out outcome) {
	h := a.readyHandle()
	if h == nil || d.route == "" || out.class == interrupted {
		return
	}
	now := a.now().UTC()
	rh := &h.health
	rh.mu.Lock()
	s := rh.state(d.route)
	if s == nil {
		rh.mu.Unlock()
		return
	}
	s.provider = d.rec.Provider
	if out.class != delivered {
		if s.failures == 0 {
			s.failingSince = now
		}
		s.failures++
		rh.mu.Unlock()
		return
	}
	recovered := s.reported
	since, failures := s.failingSince, s.failures
	s.lastSuccess, s.failingSince, s.failures, s.reported = now, time.Time{}, 0, false
	rh.mu.Unlock()
	if recovered {
		a.emitEvent(EventRouteRecovered, d.rec.Provider, map[string]any{
			"route": d.route, "failing_since": rfc3339(since), "failures": failures,
			"failed_for_seconds": int64(now.Sub(since).Seconds()), "recovered_at": rfc3339(now),
		})
	}
}

// state returns route's state, made if new; nil if the route cannot be
// tracked (maxHealthRoutes, none healthy to replace). rh.mu is held.
func (rh *routeHealth) state(route string) *routeHealthState {
	if s := rh.routes[route]; s != nil {
		return s
	}
	if rh.routes == nil {
		rh.routes = make(map[string]*routeHealthState)
	}
	if len(rh.routes) >= maxHealthRoutes {
		victim, oldest := "", time.Time{}
		for r, s := range rh.routes {
			if s.failures == 0 && (victim == "" || s.lastSuccess.Before(oldest)) {
				victim, oldest = r, s.lastSuccess
			}
		}
		if victim == "" {
			return nil
		}
		delete(rh.routes, victim)
	}
	s := new(routeHealthState)
	rh.routes[route] = s
	return s
}

// checkRoutesFailing emits pingback_route_failing, once per run of
// failures, for each route that has failed for failing_after or longer
// at now.
func (a *App) checkRoutesFailing(h *storeHandle, now time.Time) {
	after := a.failingAfter()
	type failing struct {
		route string
		s     routeHealthState
	}
	var due []failing
	rh := &h.health
	rh.mu.Lock()
	for r, s := range rh.routes {
		if s.failures > 0 && !s.reported && now.Sub(s.failingSince) >= after {
			s.reported = true
			due = append(due, failing{r, *s})
		}
	}
	rh.mu.Unlock()
	for _, f := range due {
		data := map[string]any{
			"route": f.route, "failing_since": rfc3339(f.s.failingSince), "failures": f.s.failures,
			"failing_after_seconds": int64(after.Seconds()),
		}
		if !f.s.lastSuccess.IsZero() {
			data["last_success"] = rfc3339(f.s.lastSuccess)
		}
		a.emitEvent(EventRouteFailing, f.s.provider, data)
	}
}

// routeHealthStatuses is the route_health part of /pingback/status: every
// route forwarded to in this process; an empty map when none was.
func (a *App) routeHealthStatuses() map[string]adminapi.RouteHealth {
	out := map[string]adminapi.RouteHealth{}
	h := a.readyHandle()
	if h == nil {
		return out
	}
	rh := &h.health
	rh.mu.Lock()
	defer rh.mu.Unlock()
	for r, s := range rh.routes {
		out[r] = adminapi.RouteHealth{Provider: s.provider, LastSuccess: timeOrNil(s.lastSuccess),
			FailingSince: timeOrNil(s.failingSince), Failures: s.failures}
	}
	return out
}

// timeOrNil is t, or nil when t is zero.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
