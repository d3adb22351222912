package pingback

import (
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// routeHold is how long a route's lowered replay concurrency holds
// before successes may raise it again.
const routeHold = 10 * time.Second

// routeFlows is the flow control of replays toward the app, per route
// (the host and path a result is forwarded to), in this process: a
// sender that must find what a recovering receiver can take, in the shape
// of TCP's congestion control (additive increase, multiplicative
// decrease, here by one).
//
//   - An answer that asks for less traffic (429, or 503 with Retry-After;
//     outcome.throttled) from the route, live or replayed, while c of its
//     replays are in flight, sets the route's replay limit to max(1, c-1)
//     (never above the limit it had) and holds it there at least
//     routeHold. With a Retry-After, the route's replays are paused until
//     then, capped by backoff's maximum.
//   - After as many consecutive deliveries to the route as its limit
//     (past the hold), the limit rises by one; back at the replay
//     concurrency, the route is no longer throttled.
//
// Live first attempts are never held; replays and polled results are
// (the replay loop claims them only while their route has room).
type routeFlows struct {
	mu     sync.Mutex
	routes map[string]*routeFlow
	// recent is when each route last had a replay started: the routes
	// the replay loop is draining (claimLimit).
	recent map[string]time.Time
	probed time.Time // the last claim that looked past the throttled routes
}

// routeFlow is one route's state.
type routeFlow struct {
	pair        serverProvider // the route's gauges (never its path, which may hold a secret)
	inflight    int            // replays of the route in flight
	limit       int            // replay concurrency now; 0: not throttled
	heldUntil   time.Time      // the limit does not rise before
	pausedUntil time.Time      // no replay is claimed before
	successes   int            // deliveries in a row since the limit last changed
}

// flowChange is what an outcome did to its route's state, for the log.
type flowChange int

const (
	flowSame      flowChange = iota
	flowThrottled            // the route was not throttled and now is
	flowResumed              // the route is back at full replay concurrency
)

// start counts a replay of route in flight, started at now.
func (f *routeFlows) start(route string, pair serverProvider, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.entry(route, pair)
	r.inflight++
	if f.recent == nil {
		f.recent = make(map[string]time.Time)
	}
	f.recent[route] = now
}

// done counts a replay of route as ended (after its outcome was observed).
func (f *routeFlows) done(route string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.routes[route]
	if r == nil {
		return
	}
	r.inflight--
	if r.inflight <= 0 && r.limit == 0 {
		delete(f.routes, route)
	}
}

// entry returns route's state, created if needed; f.mu is held.
func (f *routeFlows) entry(route string, pair serverProvider) *routeFlow {
	if f.routes == nil {
		f.routes = make(map[string]*routeFlow)
	}
	r := f.routes[route]
	if r == nil {
		r = &routeFlow{pair: pair}
		f.routes[route] = r
	}
	return r
}

// observe applies the outcome of one forward to route (see routeFlows):
// maxConc is the replay concurrency, capWait the longest pause (backoff's
// maximum).
func (f *routeFlows) observe(route string, pair serverProvider, out outcome, maxConc int, capWait time.Duration, now time.Time) flowChange {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case out.throttled():
		r := f.entry(route, pair)
		was := r.limit > 0
		limit := max(1, r.inflight-1)
		if was {
			limit = min(limit, r.limit)
		}
		r.limit = min(limit, maxConc)
		r.heldUntil = now.Add(routeHold)
		r.successes = 0
		if out.retryAfter > 0 {
			if until := now.Add(min(out.retryAfter, capWait)); until.After(r.pausedUntil) {
				r.pausedUntil = until
			}
		}
		if !was {
			return flowThrottled
		}
	case out.class == delivered:
		r := f.routes[route]
		if r == nil || r.limit == 0 {
			return flowSame
		}
		r.successes++
		if now.Before(r.heldUntil) || r.successes < r.limit {
			return flowSame
		}
		r.successes = 0
		r.limit++
		if r.limit < maxConc {
			return flowSame
		}
		r.limit, r.pausedUntil = 0, time.Time{}
		if r.inflight <= 0 {
			delete(f.routes, route)
		}
		return flowResumed
	case out.class.failed():
		if r := f.routes[route]; r != nil {
			r.successes = 0
		}
	}
	return flowSame
}

// room is ClaimRequest.Room: how many more replays each throttled route
// may have in flight at now (0 while paused); nil when none is throttled.
func (f *routeFlows) room(now time.Time) map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	var room map[string]int
	for route, r := range f.routes {
		if r.limit == 0 {
			continue
		}
		if room == nil {
			room = make(map[string]int)
		}
		n := max(0, r.limit-r.inflight)
		if now.Before(r.pausedUntil) {
			n = 0
		}
		room[route] = n
	}
	return room
}

// statuses is the routes part of /pingback/status: every throttled route
// with its replay concurrency now, maxConc, and the end of its pause if
// one holds at now.
func (f *routeFlows) statuses(now time.Time, maxConc int) map[string]adminapi.RouteStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]adminapi.RouteStatus)
	for route, r := range f.routes {
		if r.limit == 0 {
			continue
		}
		s := adminapi.RouteStatus{Concurrency: r.limit, Max: maxConc}
		if now.Before(r.pausedUntil) {
			until := r.pausedUntil.UTC()
			s.PausedUntil = &until
		}
		out[route] = s
	}
	return out
}

// gaugeRoutes is the throttled routes as the route gauges see them
// (metrics.setRouteGauges).
func (f *routeFlows) gaugeRoutes() []routeGauge {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []routeGauge
	for _, r := range f.routes {
		if r.limit > 0 {
			out = append(out, routeGauge{Server: r.pair.server, Provider: r.pair.provider,
				Concurrency: r.limit, PausedUntil: r.pausedUntil})
		}
	}
	return out
}

// routeRecent is how long after its last replay started a route counts as
// one the replay loop is draining; routeProbe is how often a claim looks
// past the throttled routes for records of others when every route being
// drained is throttled.
const (
	routeRecent = 5 * time.Second
	routeProbe  = time.Second
)

// claimLimit bounds a claim of free slots when room limits routes: while
// every route the loop is draining is throttled, a claim takes no more
// than their room (0: no claim), so that it does not scan past up to
// store.ClaimSkipBudget of their records each time for slots they cannot
// use; once every routeProbe it takes free, to find records of other
// routes.
func (f *routeFlows) claimLimit(free int, room map[string]int, now time.Time) int {
	if len(room) == 0 {
		return free
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	sum := 0
	for route, at := range f.recent {
		if now.Sub(at) > routeRecent {
			delete(f.recent, route)
			continue
		}
		n, limited := room[route]
		if !limited {
			return free // a route that is not throttled is being drained
		}
		sum += n
	}
	if now.Sub(f.probed) >= routeProbe {
		f.probed = now
		return free
	}
	return min(free, sum)
}

// routeOfRecord is ClaimRequest.Route: the route a stored result is
// forwarded to.
func routeOfRecord(rec *store.Record) string { return routeOf(rec.Request.Host, rec.Request.URI) }

// observeRoute applies a forward's outcome to its route's flow control
// and logs when the route becomes throttled and when it recovers (one
// line each).
func (a *App) observeRoute(d delivery, out outcome) {
	h := a.readyHandle()
	if h == nil {
		return
	}
	now := a.now()
	pair := serverProvider{d.rec.Server, d.rec.Provider}
	change := h.flows.observe(d.route, pair, out, a.Replay.Concurrency, time.Duration(a.Replay.BackoffMax), now)
	if out.throttled() || change != flowSame {
		a.setRouteGauges(h, now)
	}
	switch change {
	case flowThrottled:
		fields := []zap.Field{zap.String("route", d.route), zap.Int("status", out.status)}
		if out.retryAfter > 0 {
			fields = append(fields, zap.Duration("retry_after", out.retryAfter))
		}
		a.logger.Warn("route asked for less traffic ("+http.StatusText(out.status)+"): its replays are slowed down, and paused while its Retry-After holds; live pingbacks still go through", fields...)
	case flowResumed:
		a.logger.Info("route takes replays again at full concurrency", zap.String("route", d.route),
			zap.Int("concurrency", a.Replay.Concurrency))
	}
}

// setRouteGauges sets the route gauges from h's flow control; the replay
// loop calls it every round, so a pause that ends and a limit that rises
// show within a tick.
func (a *App) setRouteGauges(h *storeHandle, now time.Time) {
	a.metrics.setRouteGauges(h.flows.gaugeRoutes(), a.Replay.Concurrency, now)
}

// routeStatuses is the routes part of /pingback/status at now: the
// routes held back (routeFlows.statuses); an empty map when none is.
func (a *App) routeStatuses(now time.Time) map[string]adminapi.RouteStatus {
	h := a.readyHandle()
	if h == nil {
		return map[string]adminapi.RouteStatus{}
	}
	return h.flows.statuses(now, a.Replay.Concurrency)
}
