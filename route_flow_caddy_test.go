package pingback

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestThrottledRouteIsShown: an app that answers 429 with Retry-After
// throttles its route, and a user sees it: in /pingback/status's routes
// (concurrency 1 of 4, paused until the Retry-After), in the route gauges,
// and in one log line however many answers say so; no retry comes before
// the Retry-After.
func TestThrottledRouteIsShown(t *testing.T) {
	var mu sync.Mutex
	arrivals := map[string][]time.Time{}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals[drainKey(r)] = append(arrivals[drainKey(r)], time.Now())
		mu.Unlock()
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	t.Cleanup(app.Close)
	count := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return len(arrivals[id])
	}
	startDrainCaddy(t, app.URL)
	a := runningApp(t)
	core, logs := observer.New(zapcore.InfoLevel)
	a.logger = zap.New(core)
	client := &http.Client{Timeout: 10 * time.Second}

	sent := time.Now()
	for _, id := range []string{"300000001", "300000002"} {
		if problem := drainPingback(client, id); problem != "" {
			t.Fatalf("pingback %s: %s", id, problem)
		}
	}
	route := "localhost:" + testHTTPPort + "/cb"
	var st adminapi.StatusAnswer
	testkit.WaitFor(t, 5*time.Second, "the route in /pingback/status", func() bool {
		status, body := adminDo(t, http.MethodGet, "/pingback/status", "")
		if status != http.StatusOK {
			t.Fatalf("/pingback/status: %d %s", status, body)
		}
		st = adminapi.StatusAnswer{}
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatal(err)
		}
		_, ok := st.Routes[route]
		return ok
	})
	r := st.Routes[route]
	if r.Concurrency != 1 || r.Max != DefaultConcurrency || r.PausedUntil == nil ||
		r.PausedUntil.Before(sent.Add(2*time.Second)) || r.PausedUntil.After(time.Now().Add(3*time.Second)) {
		t.Fatalf("routes[%q] = %+v, want concurrency 1 of %d, paused about 3 s", route, r, DefaultConcurrency)
	}
	if len(st.Routes) != 1 {
		t.Errorf("routes %v, want only %q", st.Routes, route)
	}
	labels := `{provider="captchaai",server="srv0"}`
	if v, ok := scrapeMetric(t, "caddy_pingback_route_replay_concurrency"+labels); !ok || v != 1 {
		t.Errorf("route_replay_concurrency%s = %v (present %v), want 1", labels, v, ok)
	}
	if v, ok := scrapeMetric(t, "caddy_pingback_route_paused_until_timestamp_seconds"+labels); !ok || v < float64(sent.Unix()+2) {
		t.Errorf("route_paused_until_timestamp_seconds%s = %v (present %v), want about 3 s after the pingbacks", labels, v, ok)
	}
	if n := logs.FilterMessageSnippet("route asked for less traffic").Len(); n != 1 {
		t.Errorf("%d lines say the route was slowed down, want 1 for two 429s", n)
	}
	// The replays after the pause: none before Retry-After (3 s; less
	// 10 ms for the wall clock the due time is stored in).
	testkit.WaitFor(t, 10*time.Second, "a replay of each result", func() bool {
		return count("300000001") >= 2 && count("300000002") >= 2
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range []string{"300000001", "300000002"} {
		at := arrivals[id]
		if gap := at[1].Sub(at[0]); gap < 3*time.Second-10*time.Millisecond {
			t.Errorf("%s: replayed %v after a 429 with Retry-After: 3", id, gap)
		}
	}
}
