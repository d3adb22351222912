package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/testkit"
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
	m := measureProviders(context.Background(), cfg, 4, "", afterBounds, io.Discard)
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
	d := readDelays(context.Background(), srv.Client(), srv.URL, afterBounds)
	if d.Error != "" || d.Tasks != 20 || d.P50 != 10 || d.P95 != 19 || d.Max != 20 || d.SuggestedAfter != "29s" {
		t.Fatalf("delays %+v, want 20 tasks, p50 10s, p95 19s, max 20s, after 29s (1.5 × 19s)", d)
	}

	old := httptest.NewServer(http.NotFoundHandler())
	defer old.Close()
	if d := readDelays(context.Background(), old.Client(), old.URL, afterBounds); d.Error == "" || d.Tasks != 0 {
		t.Fatalf("an instance without the task list: %+v, want an error", d)
	}
}

// TestDrillReadsDelaysFromRunningInstance: `caddy pingback drill
// --measure-provider --address` reads the pingback delays of tracked tasks
// from a running instance's GET /pingback/tasks.
func TestDrillReadsDelaysFromRunningInstance(t *testing.T) {
	inst := startInstance(t)
	submitted := time.Now().Add(-30 * time.Second).UTC().Truncate(time.Second)
	for _, id := range []string{"73000000011", "73000000012"} {
		if status, answer := inst.register(t, map[string]string{
			"provider": "2captcha", "id": id, "pingback_url": inst.pingbackURL,
			"submitted_at": submitted.Format(time.RFC3339),
		}); status != http.StatusCreated {
			t.Fatalf("register %s: %d %s", id, status, answer)
		}
		resp, err := http.Post(inst.pingbackURL, "application/x-www-form-urlencoded", strings.NewReader("id="+id+"&code=TOKEN"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("pingback %s: %d %s", id, resp.StatusCode, body)
		}
	}
	// A task still pending has no delay to report.
	if status, answer := inst.register(t, map[string]string{
		"provider": "2captcha", "id": "73000000013", "pingback_url": inst.pingbackURL,
	}); status != http.StatusCreated {
		t.Fatalf("register: %d %s", status, answer)
	}
	elapsed := time.Since(submitted).Seconds()
	d := readDelays(t.Context(), http.DefaultClient, inst.admin, afterBounds)
	if d.Error != "" || d.Tasks != 2 {
		t.Fatalf("delays from %s: %d tasks, error %q; want the 2 tasks with a result", inst.admin, d.Tasks, d.Error)
	}
	if d.P50 < 29 || d.Max > elapsed+1 {
		t.Errorf("delays p50 %.3fs max %.3fs, want about 30s (submitted 30 s before its pingback)", d.P50, d.Max)
	}
}

// afterBounds are the plugin's `after auto` bounds, the only defaults the
// measurement reads.
var afterBounds = Defaults{AutoAfterMin: 20 * time.Second, AutoAfterMax: 120 * time.Second}

// instance is a running Caddy (the built binary) with the pingback app: a
// 2captcha pingback route on /cb in front of an app that answers 200, and
// the provider polled with a fixed after long enough that no task becomes
// due while a test runs.
type instance struct {
	admin       string // admin address, host:port
	pingbackURL string // the route's URL
}

func startInstance(t *testing.T) *instance {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(app.Close)
	sb := &sandbox{Dir: t.TempDir()}
	admin, err := sb.freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen, err := sb.freePort()
	if err != nil {
		t.Fatal(err)
	}
	sb.AdminAddr = admin
	sb.JSON = map[string]any{
		"admin": map[string]any{"listen": admin, "config": map[string]any{"persist": false}},
		"apps": map[string]any{
			"http": map[string]any{"servers": map[string]any{"srv0": map[string]any{
				"listen":          []any{listen},
				"automatic_https": map[string]any{"disable": true},
				"routes": []any{map[string]any{
					"match": []any{map[string]any{"path": []any{"/cb"}}},
					"handle": []any{
						map[string]any{"handler": "pingback", "provider": "2captcha"},
						map[string]any{"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": strings.TrimPrefix(app.URL, "http://")}}},
					},
				}},
			}}},
			// The provider's endpoint refuses connections: no test reaches
			// the real provider.
			"pingback": map[string]any{
				"storage_dir": filepath.Join(sb.Dir, "store"),
				"providers":   map[string]any{"2captcha": map[string]any{"endpoint": "http://127.0.0.1:1", "api_key": drillSimKey}},
				"poll":        map[string]any{"after": "30s"},
			},
		},
	}
	child := &drillChild{sb: sb, exe: testkit.CaddyBinary(t)}
	t.Cleanup(child.stop)
	if err := child.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(listen)
	return &instance{admin: admin, pingbackURL: "http://localhost:" + port + "/cb"}
}

// register posts a task registration (POST /pingback/tasks) and returns
// the status and the answer.
func (in *instance) register(t *testing.T, fields map[string]string) (int, string) {
	t.Helper()
	body, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+in.admin+"/pingback/tasks", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer)
}
