package testkit

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestRetryAfterDate checks that the date is at least the given time ahead,
// in whole seconds, and that its value parses back to it.
func TestRetryAfterDate(t *testing.T) {
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		now  time.Time
		want time.Time
	}{
		{"on a whole second", base, base.Add(time.Second)},
		{"just after one", base.Add(time.Millisecond), base.Add(2 * time.Second)},
		{"just before one", base.Add(999 * time.Millisecond), base.Add(2 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, value, notBefore := RetryAfterDate(http.StatusServiceUnavailable, time.Second)(tc.now)
			parsed, err := http.ParseTime(value)
			if status != http.StatusServiceUnavailable || err != nil || !parsed.Equal(tc.want) || !notBefore.Equal(tc.want) {
				t.Errorf("got %d %q (parsed %s, %v), not before %s; want 503, %s", status, value, parsed, err, notBefore, tc.want)
			}
		})
	}
}

// TestCappedApp checks that the app serves its cap at once, refuses the
// next request at once (well within the 1s service time) with its
// Retry-After, and answers 503 without one while down, recording each
// exchange by key.
func TestCappedApp(t *testing.T) {
	app := NewCappedApp(t, Capacity{
		Requests: 2,
		Service:  time.Second,
		Refuse:   RetryAfterSeconds(http.StatusTooManyRequests, 1),
		Key:      func(r *http.Request) string { return r.URL.Query().Get("id") },
	})
	get := func(id string) (int, string) {
		resp, err := http.Get(app.URL + "/?id=" + id)
		if err != nil {
			t.Errorf("GET %s: %v", id, err)
			return 0, ""
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		wg.Go(func() {
			if status, _ := get(id); status != http.StatusOK {
				t.Errorf("%s: got %d, want 200", id, status)
			}
		})
	}
	WaitFor(t, 5*time.Second, "two requests served at once", func() bool { return app.PeakInflight() == 2 })
	start := time.Now()
	status, retryAfter := get("c")
	if took := time.Since(start); status != http.StatusTooManyRequests || retryAfter != "1" || took > 500*time.Millisecond {
		t.Errorf("above the cap: got %d, Retry-After %q after %s; want 429, \"1\", at once", status, retryAfter, took)
	}
	wg.Wait()
	app.SetDown(true)
	if status, retryAfter := get("a"); status != http.StatusServiceUnavailable || retryAfter != "" {
		t.Errorf("down: got %d, Retry-After %q; want 503 and none", status, retryAfter)
	}

	for _, tc := range []struct {
		key                   string
		deliveries, exchanges int
		refused               bool
	}{
		{"a", 1, 2, false},
		{"b", 1, 1, false},
		{"c", 0, 1, true},
	} {
		ex := app.Exchanges(tc.key)
		if got := app.Deliveries(tc.key); got != tc.deliveries || len(ex) != tc.exchanges || app.Count(tc.key) != tc.exchanges {
			t.Errorf("%s: %d deliveries, %d exchanges; want %d, %d", tc.key, got, len(ex), tc.deliveries, tc.exchanges)
			continue
		}
		if ex[0].Refused != tc.refused {
			t.Errorf("%s: refused %v, want %v", tc.key, ex[0].Refused, tc.refused)
		}
		if tc.refused && ex[0].NotBefore.Sub(ex[0].Arrived) != time.Second {
			t.Errorf("%s: not before %s after arrival, want 1s", tc.key, ex[0].NotBefore.Sub(ex[0].Arrived))
		}
	}
	if peak := app.PeakInflight(); peak != 2 {
		t.Errorf("peak %d served at once, want 2", peak)
	}
}
