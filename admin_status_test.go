package pingback

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// adminStatus reads GET /pingback/status; an answer other than 200 with a
// status body fails the test.
func adminStatus(t *testing.T) adminapi.StatusAnswer {
	t.Helper()
	code, body := adminDo(t, http.MethodGet, "/pingback/status", "")
	var s adminapi.StatusAnswer
	if code != http.StatusOK || json.Unmarshal(body, &s) != nil {
		t.Fatalf("status: %d %s", code, body)
	}
	return s
}

// TestStatusAndCountGauges checks that caddy_pingback_records{state},
// caddy_pingback_tasks_pending and GET /pingback/status move as results
// are stored, delivered and parked and as tasks are tracked and complete.
func TestStatusAndCountGauges(t *testing.T) {
	app := newAppStub(t)
	startCaddyBadger(t, trkGlobal+"\n\t\treplay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))
	gauge := func(state string) float64 {
		v, _ := scrapeMetric(t, `caddy_pingback_records{provider="2captcha",state="`+state+`"}`)
		return v
	}
	pending := func() float64 {
		v, _ := scrapeMetric(t, `caddy_pingback_tasks_pending{provider="2captcha"}`)
		return v
	}

	registered := time.Now()
	for _, id := range []string{"74000000001", "74000000002"} {
		if code, body := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{
			"provider": "2captcha", "id": id, "pingback_url": trkCallbackURL,
		})); code != http.StatusCreated {
			t.Fatalf("register %s: %d %s", id, code, body)
		}
	}
	if got := pending(); got != 2 {
		t.Errorf("tasks_pending = %v after 2 registrations, want 2", got)
	}
	if s := adminStatus(t); s.Tasks["2captcha"].Pending != 2 {
		t.Errorf("status tasks = %+v, want 2 pending", s.Tasks)
	}

	if code, _ := testkit.PostForm(t, testBase+"/cb", "id=74000000001&code=A"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, 5*time.Second, "2captcha", "74000000001", store.StateDelivered)
	testkit.WaitFor(t, 5*time.Second, "records{delivered} = 1 and one task pending", func() bool {
		return gauge("delivered") == 1 && pending() == 1
	})

	app.SetStatus(http.StatusServiceUnavailable)
	if code, _ := testkit.PostForm(t, testBase+"/cb", "id=801&code=B"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, 5*time.Second, "2captcha", "801", store.StateParked)
	testkit.WaitFor(t, 5*time.Second, "records{parked} = 1", func() bool { return gauge("parked") == 1 })
	if got := gauge("failed"); got != 0 {
		t.Errorf("records{failed} = %v with nothing failed, want 0 exported", got)
	}

	// Both loops tick every second: their first run may still be ahead
	// when the results above settle (the assertions below then check
	// that it is recent and that the next one is after it).
	var s adminapi.StatusAnswer
	testkit.WaitFor(t, 5*time.Second, "both loops' first run", func() bool {
		s = adminStatus(t)
		return !s.Loops["replay"].LastRunAt.IsZero() && !s.Loops["poll"].LastRunAt.IsZero()
	})
	if r := s.Records["2captcha"]; r[store.StateDelivered] != 1 || r[store.StateParked] != 1 || len(r) != 2 {
		t.Errorf("status records = %v, want 1 delivered and 1 parked", r)
	}
	if ts := s.Tasks["2captcha"]; ts.Pending != 1 || ts.OldestPendingAgeSeconds < 0 || ts.OldestPendingAgeSeconds > time.Since(registered).Seconds() {
		t.Errorf("status tasks = %+v, want 1 pending, with an age within the %s since it was registered", s.Tasks, time.Since(registered))
	}
	if age, ok := s.OldestUndeliveredAgeSeconds["2captcha"]; !ok || age != 0 {
		t.Errorf("status oldest_undelivered_age_seconds = %v, want 0 for 2captcha (nothing failed or forwarding)", s.OldestUndeliveredAgeSeconds)
	}
	if b, ok := s.Budget["2captcha"]; !ok || b.Used+b.Left != 10*2+pollAllowance {
		t.Errorf("status budget = %v, want 2captcha's with used + left = %d (two tasks tracked)", s.Budget, 10*2+pollAllowance)
	}
	if at := s.LastCallbackAt["2captcha"]; at.IsZero() || time.Since(at) > time.Minute {
		t.Errorf("status last_callback_at = %v, want the last live pingback's time", s.LastCallbackAt)
	}
	if s.Store.FreeBytes == nil || *s.Store.FreeBytes <= 0 {
		t.Errorf("status store free_bytes = %v, want the directory's free space", s.Store.FreeBytes)
	}
	if s.Store.Kind != "badger" || s.Store.Location == "" || !s.Store.Available {
		t.Errorf("status store = %+v, want an available badger with its location", s.Store)
	}
	for _, loop := range []string{"replay", "poll"} {
		if l := s.Loops[loop]; l.LastRunAt.IsZero() || time.Since(l.LastRunAt) > 5*time.Second || !l.NextRunAt.After(l.LastRunAt) {
			t.Errorf("status loops[%s] = %+v, want a recent run and the next after it", loop, l)
		}
	}
	// No route was answered 429 or 503 with Retry-After: routes is there,
	// and empty.
	_, raw := adminDo(t, http.MethodGet, "/pingback/status", "")
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || string(fields["routes"]) != "{}" {
		t.Errorf("status routes = %s (%v), want {} with no route held back", fields["routes"], err)
	}
	if code, body := adminDo(t, http.MethodPost, "/pingback/status", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /pingback/status: %d %s, want 405", code, body)
	}
}
