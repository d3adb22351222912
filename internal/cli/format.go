package cli

import (
	"fmt"
	"time"
)

// ago formats the time since t, "-" for the zero time.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

// until formats the time from now to t, a time to come, as "in 3s" (to
// the second); a time already past as ago does ("2s ago").
func until(t, now time.Time) string {
	if !t.After(now) {
		return ago(t, now)
	}
	return "in " + t.Sub(now).Round(time.Second).String()
}

// fmtTime is t in RFC 3339 (UTC), "-" for the zero time.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// orDash is s, "-" for "".
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// flagTime reads the time flag --name: an RFC 3339 time, or a duration
// ago (2h); "" stays "". It returns the time in RFC 3339.
func flagTime(name, v string) (string, error) {
	if v == "" {
		return "", nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return time.Now().Add(-d).UTC().Format(time.RFC3339), nil
	}
	if _, err := time.Parse(time.RFC3339, v); err == nil {
		return v, nil
	}
	return "", fmt.Errorf("--%s must be an RFC 3339 time or a duration, got %q", name, v)
}
