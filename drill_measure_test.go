package pingback

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
)

// The balance request is timed against each configured endpoint of both
// API families (the simulator stands in for the provider here).
func TestMeasureProviderBalance(t *testing.T) {
	sim, err := captchasim.New(captchasim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	srv := httptest.NewServer(sim)
	defer srv.Close()
	cfg := map[string]any{"apps": map[string]any{"pingback": map[string]any{"providers": map[string]any{
		"2captcha":    map[string]any{"endpoint": srv.URL, "api_endpoint": srv.URL, "api_key": captchasim.DefaultKey},
		"anticaptcha": map[string]any{"api_endpoint": srv.URL, "api_key": "wrong key"},
	}}}}
	m := measureProviders(context.Background(), cfg, 4, "", io.Discard)
	if len(m.Endpoints) != 3 {
		t.Fatalf("%d endpoints timed, want 3 (2captcha legacy and JSON, anticaptcha JSON): %+v", len(m.Endpoints), m.Endpoints)
	}
	for _, e := range m.Endpoints {
		if e.Samples != 4 || e.Errors != 0 || e.P50 <= 0 || e.P95 < e.P50 || e.URL != srv.URL {
			t.Errorf("timing %+v", e)
		}
	}
	if st := sim.Stats(); st.ResCallsByAction["getbalance"] != 4 {
		t.Errorf("res.php getbalance calls %d, want 4", st.ResCallsByAction["getbalance"])
	}
}

// The pingback delays of a running instance come from GET /pingback/tasks
// (the operations API's pinned shape: tasks with submitted_at and
// result_at, paged by next_cursor).
func TestMeasurePingbackDelays(t *testing.T) {
	base := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	task := func(delay time.Duration) map[string]any {
		return map[string]any{"provider": "2captcha", "id": "1", "state": "done",
			"submitted_at": base, "result_at": base.Add(delay)}
	}
	var page1, page2 []any
	for i := 1; i <= 10; i++ {
		page1 = append(page1, task(time.Duration(i)*time.Second))
		page2 = append(page2, task(time.Duration(10+i)*time.Second))
	}
	page2 = append(page2, map[string]any{"provider": "2captcha", "id": "2", "state": "done", "submitted_at": base}) // no result_at
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pingback/tasks" || r.URL.Query().Get("state") != "done" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("cursor") == "" {
			_ = json.NewEncoder(w).Encode(map[string]any{"tasks": page1, "next_cursor": "p2"})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tasks": page2})
	}))
	defer srv.Close()
	d := readDelays(context.Background(), srv.Client(), srv.URL)
	if d.Error != "" || d.Tasks != 20 || d.P50 != 10 || d.P95 != 19 || d.Max != 20 || d.SuggestedAfter != "29s" {
		t.Fatalf("delays %+v, want 20 tasks, p50 10s, p95 19s, max 20s, after 29s (1.5 × 19s)", d)
	}

	old := httptest.NewServer(http.NotFoundHandler())
	defer old.Close()
	if d := readDelays(context.Background(), old.Client(), old.URL); d.Error == "" || d.Tasks != 0 {
		t.Fatalf("an instance without the task list: %+v, want an error", d)
	}
}

// TestDrillReadsDelaysFromRunningInstance: `caddy pingback drill
// --measure-provider --address` reads the pingback delays of tracked tasks
// from a running instance's GET /pingback/tasks.
func TestDrillReadsDelaysFromRunningInstance(t *testing.T) {
	startAdminCaddy(t)
	submitted := time.Now().Add(-30 * time.Second).UTC().Truncate(time.Second)
	for _, id := range []string{"73000000011", "73000000012"} {
		if status, answer := adminCall(t, http.MethodPost, adminRegistration(t, map[string]string{
			"provider": "2captcha", "id": id, "pingback_url": trkCallbackURL,
			"submitted_at": submitted.Format(time.RFC3339),
		})); status != http.StatusCreated {
			t.Fatalf("register %s: %d %s", id, status, answer)
		}
		if status, body := postForm(t, testBase+"/cb", "id="+id+"&code=TOKEN"); status != http.StatusOK {
			t.Fatalf("pingback %s: %d %s", id, status, body)
		}
	}
	// A task still pending has no delay to report.
	if status, answer := adminCall(t, http.MethodPost, adminRegistration(t, map[string]string{
		"provider": "2captcha", "id": "73000000013", "pingback_url": trkCallbackURL,
	})); status != http.StatusCreated {
		t.Fatalf("register: %d %s", status, answer)
	}
	elapsed := time.Since(submitted).Seconds()
	d := readDelays(t.Context(), http.DefaultClient, testAdmin)
	if d.Error != "" || d.Tasks != 2 {
		t.Fatalf("delays from %s: %d tasks, error %q; want the 2 tasks with a result", testAdmin, d.Tasks, d.Error)
	}
	if d.P50 < 29 || d.Max > elapsed+1 {
		t.Errorf("delays p50 %.3fs max %.3fs, want about 30s (submitted 30 s before its pingback)", d.P50, d.Max)
	}
}
