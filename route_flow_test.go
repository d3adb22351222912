package pingback

import (
	"net/http"
	"testing"
	"time"
)

// TestRouteFlows follows one route through the pinned rules: a 429 or a
// 503 with Retry-After with c replays in flight sets the limit to
// max(1, c-1) for at least routeHold; as many deliveries in a row as the
// limit raise it by one; back at the replay concurrency the route is no
// longer throttled. Retry-After pauses the route, capped by capWait.
func TestRouteFlows(t *testing.T) {
	const route, maxConc, capWait = "app.example/cb", 4, 30 * time.Second
	pair := serverProvider{"srv0", "2captcha"}
	t0 := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	tooMany := outcome{class: retryable, status: http.StatusTooManyRequests, retryAfter: time.Second}
	unavailableRA := outcome{class: retryable, status: http.StatusServiceUnavailable, retryAfter: 2 * time.Second}
	unavailable := outcome{class: retryable, status: http.StatusServiceUnavailable}
	ok := outcome{class: delivered, status: http.StatusOK}

	type step struct {
		at       time.Duration // since t0
		inflight int           // replays of the route in flight when the outcome comes
		out      outcome
		change   flowChange
		limit    int           // room's limit after the step; 0: not in room (not throttled)
		paused   time.Duration // end of a pause still holding, since t0; 0: none
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"429 with 4 in flight lowers to 3 and pauses for Retry-After", []step{
			{at: 0, inflight: 4, out: tooMany, change: flowThrottled, limit: 3, paused: time.Second},
		}},
		{"429 with none in flight (a live pingback) lowers to 1", []step{
			{at: 0, inflight: 0, out: outcome{class: retryable, status: http.StatusTooManyRequests}, change: flowThrottled, limit: 1},
		}},
		{"503 with Retry-After throttles, 503 without does not", []step{
			{at: 0, inflight: 4, out: unavailable, limit: 0},
			{at: 0, inflight: 4, out: unavailableRA, change: flowThrottled, limit: 3, paused: 2 * time.Second},
		}},
		{"Retry-After capped by backoff's maximum", []step{
			{at: 0, inflight: 2, out: outcome{class: retryable, status: http.StatusTooManyRequests, retryAfter: time.Hour}, change: flowThrottled, limit: 1, paused: capWait},
		}},
		{"a second 429 never raises the limit", []step{
			{at: 0, inflight: 2, out: tooMany, change: flowThrottled, limit: 1, paused: time.Second},
			{at: time.Second, inflight: 4, out: tooMany, limit: 1, paused: 2 * time.Second},
		}},
		{"successes during the hold do not raise it", []step{
			{at: 0, inflight: 4, out: tooMany, change: flowThrottled, limit: 3, paused: time.Second},
			{at: 2 * time.Second, out: ok, limit: 3},
			{at: 3 * time.Second, out: ok, limit: 3},
			{at: 4 * time.Second, out: ok, limit: 3},
			{at: 5 * time.Second, out: ok, limit: 3},
		}},
		{"after the hold, limit-many successes in a row raise it by one, up to full", []step{
			{at: 0, inflight: 3, out: tooMany, change: flowThrottled, limit: 2, paused: time.Second},
			{at: 11 * time.Second, out: ok, limit: 2},
			{at: 11 * time.Second, out: ok, limit: 3},
			{at: 12 * time.Second, out: ok, limit: 3},
			{at: 12 * time.Second, out: ok, limit: 3},
			{at: 12 * time.Second, out: ok, change: flowResumed, limit: 0},
		}},
		{"a failure breaks the streak", []step{
			{at: 0, inflight: 3, out: tooMany, change: flowThrottled, limit: 2, paused: time.Second},
			{at: 11 * time.Second, out: ok, limit: 2},
			{at: 11 * time.Second, out: unavailable, limit: 2},
			{at: 11 * time.Second, out: ok, limit: 2},
			{at: 11 * time.Second, out: ok, limit: 3},
		}},
		{"deliveries on a route never throttled change nothing", []step{
			{at: 0, out: ok, limit: 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f routeFlows
			for i, s := range tt.steps {
				for range s.inflight {
					f.start(route, pair, t0)
				}
				now := t0.Add(s.at)
				if got := f.observe(route, pair, s.out, maxConc, capWait, now); got != s.change {
					t.Fatalf("step %d: change %v, want %v", i, got, s.change)
				}
				for range s.inflight {
					f.done(route)
				}
				r := f.routes[route]
				limit, paused := 0, time.Duration(0)
				if r != nil {
					limit = r.limit
					if r.pausedUntil.After(now) {
						paused = r.pausedUntil.Sub(t0)
					}
				}
				if limit != s.limit || paused != s.paused {
					t.Fatalf("step %d: limit %d paused %v, want limit %d paused %v", i, limit, paused, s.limit, s.paused)
				}
			}
		})
	}
}

// TestRouteFlowsRoom checks the claim's view: a paused route has no room,
// a throttled one its limit less its replays in flight, and the others
// are not limited.
func TestRouteFlowsRoom(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	pair := serverProvider{"srv0", "2captcha"}
	var f routeFlows
	for range 4 {
		f.start("a/cb", pair, t0)
	}
	f.start("b/cb", pair, t0)
	f.observe("a/cb", pair, outcome{class: retryable, status: http.StatusTooManyRequests, retryAfter: time.Second}, 4, time.Minute, t0)
	if room := f.room(t0.Add(500 * time.Millisecond)); len(room) != 1 || room["a/cb"] != 0 {
		t.Fatalf("while paused: room %v, want a/cb 0 only", room)
	}
	f.done("a/cb")
	f.done("a/cb")
	if room := f.room(t0.Add(time.Second)); room["a/cb"] != 1 {
		t.Fatalf("pause over, limit 3, 2 in flight: room %v, want a/cb 1", room)
	}
	st := f.statuses(t0.Add(500*time.Millisecond), 4)
	if s := st["a/cb"]; s.Concurrency != 3 || s.Max != 4 || s.PausedUntil == nil || !s.PausedUntil.Equal(t0.Add(time.Second)) {
		t.Fatalf("status while paused: %+v", st)
	}
	if _, listed := st["b/cb"]; listed {
		t.Fatalf("a route never throttled is listed: %+v", st)
	}
	if s := f.statuses(t0.Add(2*time.Second), 4)["a/cb"]; s.PausedUntil != nil {
		t.Fatalf("pause over but status says paused until %v", s.PausedUntil)
	}
	if g := f.gaugeRoutes(); len(g) != 1 || g[0] != (routeGauge{Server: "srv0", Provider: "2captcha", Concurrency: 3, PausedUntil: t0.Add(time.Second)}) {
		t.Fatalf("gauge routes %+v", g)
	}
}

// TestRouteFlowsClaimLimit checks that a claim is bounded by the room of
// the throttled routes while they are all that is being drained, looks
// past them once every routeProbe, and is not bounded while a route that
// is not throttled is being drained.
func TestRouteFlowsClaimLimit(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	pair := serverProvider{"srv0", "2captcha"}
	var f routeFlows
	if got := f.claimLimit(4, nil, t0); got != 4 {
		t.Fatalf("no route throttled: limit %d, want 4", got)
	}
	for range 3 {
		f.start("a/cb", pair, t0)
	}
	f.observe("a/cb", pair, outcome{class: retryable, status: http.StatusTooManyRequests}, 4, time.Minute, t0)
	room := f.room(t0) // limit 2, 3 in flight: 0
	if got := f.claimLimit(1, room, t0); got != 1 {
		t.Fatalf("first claim probes: limit %d, want 1", got)
	}
	if got := f.claimLimit(1, room, t0.Add(100*time.Millisecond)); got != 0 {
		t.Fatalf("only a throttled route without room is drained: limit %d, want 0", got)
	}
	f.done("a/cb")
	f.done("a/cb")
	if got := f.claimLimit(3, f.room(t0.Add(200*time.Millisecond)), t0.Add(200*time.Millisecond)); got != 1 {
		t.Fatalf("the throttled route has room 1: limit %d, want 1", got)
	}
	if got := f.claimLimit(3, f.room(t0.Add(time.Second+200*time.Millisecond)), t0.Add(time.Second+200*time.Millisecond)); got != 3 {
		t.Fatalf("a second later the claim probes: limit %d, want 3", got)
	}
	f.start("b/cb", pair, t0.Add(1300*time.Millisecond))
	if got := f.claimLimit(3, f.room(t0.Add(1400*time.Millisecond)), t0.Add(1400*time.Millisecond)); got != 3 {
		t.Fatalf("an unthrottled route is drained too: limit %d, want 3", got)
	}
}
