package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
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
