package pingback

import (
	"net/http"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		status int
		value  string
		want   time.Duration
	}{
		{"429 delta-seconds", 429, "1", time.Second},
		{"503 delta-seconds", 503, "120", 2 * time.Minute},
		{"spaces around", 429, "  3 ", 3 * time.Second},
		{"503 HTTP-date", 503, now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{"429 RFC 850 date", 429, now.Add(time.Hour).Format(time.RFC850), time.Hour},
		{"429 asctime date", 429, now.Add(time.Minute).Format(time.ANSIC), time.Minute},
		{"zero is ignored", 429, "0", 0},
		{"past date is ignored", 503, now.Add(-time.Second).Format(http.TimeFormat), 0},
		{"date now is ignored", 503, now.Format(http.TimeFormat), 0},
		{"negative is ignored", 429, "-5", 0},
		{"fraction is ignored", 429, "1.5", 0},
		{"garbage is ignored", 503, "soon", 0},
		{"empty is ignored", 429, "", 0},
		{"overflowing delta is ignored", 429, "99999999999999999999", 0},
		{"very large delta", 429, "18446744073709551615", maxRetryAfterSeconds * time.Second},
		{"far date is bounded", 503, "Fri, 31 Dec 9999 23:59:59 GMT", maxRetryAfterSeconds * time.Second},
		{"500 is not honoured", 500, "1", 0},
		{"502 is not honoured", 502, "1", 0},
		{"200 is not honoured", 200, "1", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.value != "" {
				h.Set("Retry-After", tt.value)
			}
			if got := retryAfter(tt.status, h, now); got != tt.want {
				t.Errorf("retryAfter(%d, %q) = %v, want %v", tt.status, tt.value, got, tt.want)
			}
		})
	}
}

// FuzzParseRetryAfter checks that no value panics and that every wait is
// positive, bounded, and only given for a value that is digits or a date.
func FuzzParseRetryAfter(f *testing.F) {
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	for _, s := range []string{"1", "0", "120", "Wed, 02 Dec 2026 15:00:01 GMT", "Tuesday, 01-Dec-26 15:00:00 GMT",
		"Wed Dec  2 15:00:01 2026", "-1", "1e3", " 7 ", "", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got := parseRetryAfter(v, now)
		if got < 0 || got > maxRetryAfterSeconds*time.Second {
			t.Fatalf("parseRetryAfter(%q) = %v: out of range", v, got)
		}
		if got > 0 && got%time.Second != 0 {
			t.Fatalf("parseRetryAfter(%q) = %v: not whole seconds (both forms have second precision)", v, got)
		}
	})
}
