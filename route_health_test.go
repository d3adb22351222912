package pingback

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// routeHealthOf reads route's health from /pingback/status (ok false when
// the route is not listed).
func routeHealthOf(t *testing.T, route string) (adminapi.RouteHealth, bool) {
	t.Helper()
	status, body := adminDo(t, http.MethodGet, "/pingback/status", "")
	if status != http.StatusOK {
		t.Fatalf("status: %d %s", status, body)
	}
	var ans struct {
		RouteHealth map[string]adminapi.RouteHealth `json:"route_health"`
	}
	if err := json.Unmarshal(body, &ans); err != nil {
		t.Fatal(err)
	}
	if ans.RouteHealth == nil {
		t.Fatalf("status without route_health: %s", body)
	}
	h, ok := ans.RouteHealth[route]
	return h, ok
}

// TestRouteHealthInStatus: /pingback/status says per route since when it
// fails (the first failure of the run) and when it last succeeded, from
// live forwards and replays alike.
func TestRouteHealthInStatus(t *testing.T) {
	app := newAppStub(t)
	app.SetStatus(http.StatusServiceUnavailable)
	startCaddy(t, "replay {\n\tbackoff 50ms 100ms\n\tmax_attempts 3\n}", pingbackSite("captchaai", "", app))
	route := "localhost:" + testHTTPPort + "/cb"
	if _, ok := routeHealthOf(t, route); ok {
		t.Fatal("a route listed before any forward")
	}

	before := time.Now().UTC().Add(-time.Second)
	if status, _ := testkit.Get(t, testBase+"/cb?id=37001&code=T"); status != http.StatusOK {
		t.Fatalf("pingback answered %d", status)
	}
	waitForState(t, 10*time.Second, "captchaai", "37001", store.StateParked) // the live forward and two replays failed
	h, ok := routeHealthOf(t, route)
	if !ok || h.Provider != "captchaai" || h.LastSuccess != nil || h.FailingSince == nil || h.Failures != 3 {
		t.Fatalf("route health %+v (listed %v), want captchaai failing since the first forward, 3 failures, no success", h, ok)
	}
	since := *h.FailingSince
	if since.Before(before) || since.After(time.Now()) {
		t.Errorf("failing_since %s, want the first failure (after %s)", since, before)
	}

	app.SetStatus(http.StatusOK)
	if status, _ := testkit.Get(t, testBase+"/cb?id=37002&code=T"); status != http.StatusOK {
		t.Fatalf("pingback answered %d", status)
	}
	waitForState(t, 10*time.Second, "captchaai", "37002", store.StateDelivered)
	testkit.WaitFor(t, 5*time.Second, "the route healthy", func() bool {
		h, _ = routeHealthOf(t, route)
		return h.FailingSince == nil
	})
	if h.LastSuccess == nil || h.LastSuccess.Before(since) || h.Failures != 0 {
		t.Errorf("route health after a delivery %+v, want a last success after %s and no failures", h, since)
	}
}

// TestRouteHealthBounded: beyond maxHealthRoutes routes, a new one takes
// the place of the healthy route that succeeded longest ago, and is not
// tracked while every route fails.
func TestRouteHealthBounded(t *testing.T) {
	var rh routeHealth
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range maxHealthRoutes {
		s := rh.state(fmt.Sprintf("r%d", i))
		s.lastSuccess = t0.Add(time.Duration(i) * time.Second)
	}
	rh.routes["r0"].failures = 1 // failing: never replaced
	if rh.state("new") == nil {
		t.Fatal("a new route was not tracked though healthy ones can go")
	}
	if _, ok := rh.routes["r1"]; ok {
		t.Error("r1, the healthy route that succeeded longest ago, was kept")
	}
	if _, ok := rh.routes["r0"]; !ok {
		t.Error("the failing r0 was replaced")
	}
	for _, s := range rh.routes {
		s.failures = 1
	}
	if rh.state("another") != nil || len(rh.routes) != maxHealthRoutes {
		t.Errorf("a route tracked beyond the bound while every route fails (%d routes)", len(rh.routes))
	}
}
