package adminapi

import (
	"encoding/json"
	"testing"
	"time"
)

// TestRouteStatusJSON pins the contract of "routes" in GET
// /pingback/status: host and path → {"paused_until", "concurrency",
// "max"}, paused_until an RFC 3339 time or null, and {} (never null or
// absent) when no route is held back; it reads back as it was written.
func TestRouteStatusJSON(t *testing.T) {
	until := time.Date(2026, 12, 1, 15, 39, 5, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		routes map[string]RouteStatus
		want   string
	}{
		{name: "none", routes: map[string]RouteStatus{}, want: `{}`},
		{name: "paused", routes: map[string]RouteStatus{"app.example/cb": {PausedUntil: &until, Concurrency: 1, Max: 4}},
			want: `{"app.example/cb":{"paused_until":"2026-12-01T15:39:05Z","concurrency":1,"max":4}}`},
		{name: "below max, not paused", routes: map[string]RouteStatus{"app.example/cb/2": {Concurrency: 3, Max: 4}},
			want: `{"app.example/cb/2":{"paused_until":null,"concurrency":3,"max":4}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(StatusAnswer{Routes: tc.routes})
			if err != nil {
				t.Fatal(err)
			}
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(b, &fields); err != nil {
				t.Fatal(err)
			}
			if got := string(fields["routes"]); got != tc.want {
				t.Errorf("routes = %s, want %s", got, tc.want)
			}
			var back StatusAnswer
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if len(back.Routes) != len(tc.routes) {
				t.Fatalf("read back %v, want %v", back.Routes, tc.routes)
			}
			for route, want := range tc.routes {
				got := back.Routes[route]
				if got.Concurrency != want.Concurrency || got.Max != want.Max || (got.PausedUntil == nil) != (want.PausedUntil == nil) ||
					got.PausedUntil != nil && !got.PausedUntil.Equal(*want.PausedUntil) {
					t.Errorf("%s read back as %+v, want %+v", route, got, want)
				}
			}
		})
	}
}
