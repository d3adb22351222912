package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
)

// TestFlagUntil: --until takes an RFC 3339 time or a duration from now.
func TestFlagUntil(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 40, 0, 0, time.UTC)
	for _, tc := range []struct {
		in, want string
		fail     bool
	}{
		{"", "", false},
		{"30m", "2026-12-01T16:10:00Z", false},
		{"2026-12-01T18:00:00+01:00", "2026-12-01T18:00:00+01:00", false},
		{"tomorrow", "", true},
	} {
		got, err := flagUntil(tc.in, now)
		if (err != nil) != tc.fail || got != tc.want {
			t.Errorf("flagUntil(%q) = %q, %v; want %q (error %v)", tc.in, got, err, tc.want, tc.fail)
		}
	}
}

// TestWritePauses: the pauses table of status, nothing without pauses.
func TestWritePauses(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 42, 0, 0, time.UTC)
	since := now.Add(-2 * time.Minute)
	end := now.Add(28 * time.Minute)
	var out bytes.Buffer
	if err := writePauses(&out, nil, now); err != nil || out.Len() != 0 {
		t.Fatalf("no pauses wrote %q, %v", out.String(), err)
	}
	err := writePauses(&out, []adminapi.Pause{
		{Provider: "*", Since: since, By: "console"},
		{Provider: "captchaai", Reason: "deploy 4.2", Since: since, Until: &end, By: "cli"},
	}, now)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := [][]string{
		{"PAUSED", "SINCE", "UNTIL", "BY", "REASON"},
		{"*", "2026-12-01T15:40:00Z (2m0s ago)", "-", "console", "-"},
		{"captchaai", "2026-12-01T15:40:00Z (2m0s ago)", "2026-12-01T16:10:00Z (in 28m0s)", "cli", "deploy 4.2"},
	}
	if len(lines) != len(want) {
		t.Fatalf("table:\n%s", out.String())
	}
	for i, cells := range want {
		for _, c := range cells {
			if !strings.Contains(lines[i], c) {
				t.Errorf("line %d %q lacks %q", i, lines[i], c)
			}
		}
	}
}
