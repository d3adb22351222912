package adminapi

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestReplayFilterParse checks the provider (through the given check),
// the state and the times, and Matches excludes both bounds.
func TestReplayFilterParse(t *testing.T) {
	known := func(name string) error {
		if name != "2captcha" {
			return errors.New("unknown provider " + name)
		}
		return nil
	}
	for _, tc := range []struct {
		name string
		f    ReplayFilter
		err  string
	}{
		{name: "empty", f: ReplayFilter{}},
		{name: "all fields", f: ReplayFilter{Provider: "2captcha", State: store.StateParked,
			ReceivedAfter: "2026-01-01T00:00:00Z", ReceivedBefore: "2026-01-02T00:00:00Z"}},
		{name: "unknown provider", f: ReplayFilter{Provider: "x", State: "lost"}, err: "unknown provider x"},
		{name: "expired state", f: ReplayFilter{State: store.StateExpired}},
		{name: "unknown state", f: ReplayFilter{State: "lost"}, err: `unknown state "lost"`},
		{name: "bad after", f: ReplayFilter{ReceivedAfter: "yesterday"}, err: "received_after must be an RFC 3339 time"},
		{name: "bad before", f: ReplayFilter{ReceivedBefore: "2026-01-02"}, err: "received_before must be an RFC 3339 time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.Parse(known)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("Parse: %v, want error %q", err, tc.err)
			}
		})
	}
	f := ReplayFilter{ReceivedAfter: "2026-01-01T00:00:00Z", ReceivedBefore: "2026-01-02T00:00:00Z"}
	if err := f.Parse(known); err != nil {
		t.Fatal(err)
	}
	after, before := f.After(), f.Before()
	if !after.Equal(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)) || !before.Equal(time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("After, Before = %s, %s", after, before)
	}
	for _, x := range []struct {
		at   time.Time
		want bool
	}{{after, false}, {after.Add(time.Nanosecond), true}, {before.Add(-time.Nanosecond), true}, {before, false}} {
		if got := f.Matches(&store.Record{ReceivedAt: x.at}); got != x.want {
			t.Errorf("Matches(received %s) = %v, want %v", x.at, got, x.want)
		}
	}
	if !(&ReplayFilter{}).Matches(&store.Record{}) {
		t.Error("an empty filter does not match")
	}
}
