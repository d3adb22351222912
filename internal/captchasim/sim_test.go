package captchasim

import (
	"encoding/json"
	"math"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

func TestNewValidation(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"zero config", Config{}, ""},
		{"rate above 1", Config{DropRate: 1.5}, "drop rate"},
		{"negative rate", Config{ServerErrorRate: -0.1}, "server error rate"},
		{"NaN rate", Config{UnsolvableRate: math.NaN()}, "unsolvable rate"},
		{"max below min", Config{SolveMin: 2 * time.Second, SolveMax: time.Second}, "solve max"},
		{"negative solve", Config{SolveMin: -time.Second}, "negative"},
		{"bad pingback method", Config{PingbackMethod: "PUT"}, "pingback method"},
		{"negative late delay", Config{LateDelay: -time.Second}, "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.cfg)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				_ = s.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("New error %v, want one mentioning %q", err, tc.wantErr)
			}
			if err.Error() != strings.ToLower(err.Error()[:1])+err.Error()[1:] {
				t.Errorf("error %q does not start lower-case", err)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := s.Config()
	if c.Key != DefaultKey || c.PingbackMethod != http.MethodPost || c.ForgetAfter != 15*time.Minute ||
		c.LateDelay != DefaultLateDelay || c.PingbackTimeout != DefaultPingbackTimeout ||
		c.BudgetAllowance != 1200 || c.BudgetPerTask != 20 || c.Price != DefaultPrice ||
		c.Balance != DefaultBalance || c.Now == nil || c.Logger == nil {
		t.Errorf("defaults not applied: %+v", c)
	}
}

func TestRouting(t *testing.T) {
	_, base := startSim(t, Config{SolveMin: never, SolveMax: never})
	tests := []struct {
		method, path string
		want         int
	}{
		{http.MethodGet, "/in.php", http.StatusOK},
		{http.MethodGet, "/prefix/2captcha/res.php", http.StatusOK},
		{http.MethodGet, "/stats", http.StatusOK},
		{http.MethodGet, "/nothing", http.StatusNotFound},
		{http.MethodPut, "/in.php", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/res.php", http.StatusMethodNotAllowed},
		{http.MethodPost, "/stats", http.StatusMethodNotAllowed},
	}
	for _, tc := range tests {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, base+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r := do(t, req); r.status != tc.want {
				t.Errorf("status %d, want %d (body %q)", r.status, tc.want, r.body)
			}
		})
	}
}

func TestStatsEndpoint(t *testing.T) {
	rc := startReceiver(t, 0)
	s, base := startSim(t, Config{SolveMin: never, SolveMax: never})
	a := submit(t, base, "hcaptcha", url.Values{"pingback": {rc.url}})
	c := submit(t, base, "base64", nil)
	if r := get(t, base, "in.php", url.Values{"key": {"wrong"}, "method": {"hcaptcha"}}); r.body != CodeWrongUserKey {
		t.Fatalf("wrong key submit: %q", r.body)
	}
	s.Solve(a)
	testkit.WaitFor(t, 3*time.Second, "pingback", func() bool { return s.Stats().PingbacksSent == 1 })
	res(t, base, url.Values{"action": {"get"}, "id": {a}})
	res(t, base, url.Values{"action": {"get"}, "id": {a}})
	res(t, base, url.Values{"action": {"get"}, "id": {c}})
	res(t, base, url.Values{"action": {"getbalance"}})
	res(t, base, url.Values{"action": {"get"}, "ids": {a + "," + c}})

	r := get(t, base, "stats", nil)
	if r.status != http.StatusOK || r.ctype != "application/json" {
		t.Fatalf("GET /stats: %d %q", r.status, r.ctype)
	}
	var got Stats
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
	want := Stats{
		InCalls: 3, Submits: 2, SubmitErrors: 1,
		ResCalls: 5, ResCallsByAction: map[string]int64{"get": 4, "getbalance": 1}, BulkCalls: 1,
		ResCallsPerTaskMax: 3, ResCallsPerTaskAvg: 2.5,
		PingbacksSent: 1, TasksPending: 1, TasksSolved: 1,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("/stats\n got %+v\nwant %+v", got, want)
	}
	if api := s.Stats(); !reflect.DeepEqual(api, want) {
		t.Errorf("Stats()\n got %+v\nwant %+v", api, want)
	}
	for _, key := range []string{"submits", "res_calls", "res_calls_by_action", "bulk_calls", "pingbacks_sent",
		"pingbacks_dropped", "pingbacks_duplicated", "pingbacks_late", "pingbacks_failed", "server_errors",
		"no_slots", "budget_blocks", "tasks_solved", "tasks_unsolvable", "tasks_forgotten",
		"res_calls_per_task_max", "res_calls_per_task_avg"} {
		if !strings.Contains(r.body, `"`+key+`":`) {
			t.Errorf("/stats lacks %q: %s", key, r.body)
		}
	}
}
