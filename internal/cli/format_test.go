package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestFlagTime reads RFC 3339 times as they are and durations as a time
// ago, and names the flag in its error.
func TestFlagTime(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "", want: ""},
		{in: "2026-01-02T03:04:05Z", want: "2026-01-02T03:04:05Z"},
		{in: "2026-01-02T03:04:05+02:00", want: "2026-01-02T03:04:05+02:00"},
		{in: "yesterday", err: `--since must be an RFC 3339 time or a duration, got "yesterday"`},
		{in: "2026-01-02", err: "--since must be"},
	} {
		got, err := flagTime("since", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("flagTime(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("flagTime(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	before := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	got, err := flagTime("since", "2h")
	if err != nil {
		t.Fatal(err)
	}
	at, err := time.Parse(time.RFC3339, got)
	if err != nil || at.Before(before) || at.After(before.Add(time.Minute)) {
		t.Errorf("flagTime(2h) = %q (%v), want about %s", got, err, before.UTC().Format(time.RFC3339))
	}
}

// TestProgressBar draws 40 columns whatever the counts.
func TestProgressBar(t *testing.T) {
	for _, tc := range []struct {
		done, matched int
		want          string
	}{
		{0, 0, "[########################################] 0/0"},
		{0, 10, "[........................................] 0/10"},
		{5, 10, "[####################....................] 5/10"},
		{10, 10, "[########################################] 10/10"},
	} {
		got := progressBar(adminapi.ReplayJobState{Done: tc.done, Matched: tc.matched})
		if !strings.HasPrefix(got, tc.want+", ") {
			t.Errorf("progressBar(%d/%d) = %q, want %q...", tc.done, tc.matched, got, tc.want)
		}
	}
}

// TestUntil counts a time to come as "in ..." and a time past as ago.
func TestUntil(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 39, 2, 0, time.UTC)
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{now.Add(3 * time.Second), "in 3s"},
		{now.Add(2600 * time.Millisecond), "in 3s"},
		{now.Add(90 * time.Second), "in 1m30s"},
		{now, "0s ago"},
		{now.Add(-2 * time.Second), "2s ago"},
	} {
		if got := until(tc.at, now); got != tc.want {
			t.Errorf("until(now%+v) = %q, want %q", tc.at.Sub(now), got, tc.want)
		}
	}
}

// TestWriteStatus checks `caddy pingback status` on StatusAnswer values:
// the routes held back are listed by route, with when their replays
// resume (a time and "in 3s", "-" when not paused) and their replay
// concurrency "n of max"; with none, nothing is added.
func TestWriteStatus(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 39, 2, 0, time.UTC)
	paused := now.Add(3 * time.Second)
	over := now.Add(-time.Second)
	base := func(routes map[string]adminapi.RouteStatus) adminapi.StatusAnswer {
		return adminapi.StatusAnswer{
			Records:        map[string]map[store.State]int64{"2captcha": {store.StateDelivered: 3, store.StateFailed: 1}},
			Tasks:          map[string]adminapi.TaskStatus{"2captcha": {Pending: 1, OldestPendingAgeSeconds: 3}},
			LastCallbackAt: map[string]time.Time{"2captcha": now.Add(-3 * time.Second)},
			Loops: map[string]adminapi.LoopStatus{
				"replay": {LastRunAt: now, NextRunAt: now.Add(time.Second)},
				"poll":   {LastRunAt: now.Add(-time.Second), NextRunAt: now},
			},
			Store:  adminapi.StoreStatus{Kind: "badger", Location: "/var/lib/caddy/pingback", Available: true},
			Routes: routes,
		}
	}
	const providers = `PROVIDER  STORED  DELIVERED  FAILED  REJECTED  PARKED  PENDING TASKS  OLDEST PENDING  LAST PINGBACK
2captcha  4       3          1       0         0       1              3s              3s ago
`
	const tail = `loop replay: last run 0s ago
loop poll: last run 1s ago
store: badger /var/lib/caddy/pingback, available
`
	for _, tc := range []struct {
		name   string
		routes map[string]adminapi.RouteStatus
		want   string
	}{
		{name: "no route held back", routes: map[string]adminapi.RouteStatus{}, want: providers + tail},
		{name: "routes absent (an older Caddy)", routes: nil, want: providers + tail},
		{name: "paused, below max, pause just over", routes: map[string]adminapi.RouteStatus{
			"app.example/cb":      {PausedUntil: &paused, Concurrency: 1, Max: 4},
			"app.example/cb/json": {Concurrency: 3, Max: 4},
			"api.example/hook":    {PausedUntil: &over, Concurrency: 2, Max: 4},
		}, want: providers + `ROUTE                PAUSED UNTIL                   REPLAY CONCURRENCY
api.example/hook     2026-12-01T15:39:01Z (1s ago)  2 of 4
app.example/cb       2026-12-01T15:39:05Z (in 3s)   1 of 4
app.example/cb/json  -                              3 of 4
` + tail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if err := writeStatus(&out, base(tc.routes), now); err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}
