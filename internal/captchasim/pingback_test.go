package captchasim

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

func TestPingbackDelivery(t *testing.T) {
	tests := []struct {
		name       string
		method     string // Config.PingbackMethod
		wantMethod string
		unsolvable bool
		submitJSON bool
	}{
		{"default is POST", "", http.MethodPost, false, false},
		{"POST", "POST", http.MethodPost, false, true},
		{"GET", "GET", http.MethodGet, false, false},
		{"get lower case", "get", http.MethodGet, false, false},
		{"unsolvable POST", "POST", http.MethodPost, true, false},
		{"unsolvable GET", "GET", http.MethodGet, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := startReceiver(t, 0)
			var rate float64
			if tc.unsolvable {
				rate = 1
			}
			s, base := startSim(t, Config{PingbackMethod: tc.method, UnsolvableRate: rate,
				SolveMin: 5 * time.Millisecond, SolveMax: 20 * time.Millisecond})
			// The receiver URL carries its own query (a per-task secret, §2.1);
			// a POST multipart submit keeps it intact (§1.2).
			pingback := rc.url + "/cb?token=abc&x=1"
			v := url.Values{"key": {testKey}, "method": {"funcaptcha"}, "pingback": {pingback}}
			if tc.submitJSON {
				v.Set("json", "1")
			}
			r := postMultipart(t, base, "in.php", v, nil)
			id := strings.TrimPrefix(r.body, "OK|")
			if tc.submitJSON {
				id = decodeReply(t, r.body).requestString(t)
			}
			info, ok := s.Task(id)
			if !ok || info.Pingback != pingback {
				t.Fatalf("submit %q: task %+v", r.body, info)
			}

			testkit.WaitFor(t, 3*time.Second, "one pingback", func() bool { return rc.count() >= 1 })
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			hits := rc.got()
			if len(hits) != 1 {
				t.Fatalf("%d pingbacks, want 1: %+v", len(hits), hits)
			}
			h := hits[0]
			wantCode := info.Code
			if tc.unsolvable {
				wantCode = CodeUnsolvable
			}
			if h.method != tc.wantMethod || h.path != "/cb" || h.id != id || h.code != wantCode {
				t.Errorf("pingback %s %s id=%q code=%q; want %s /cb id=%q code=%q", h.method, h.path, h.id, h.code, tc.wantMethod, id, wantCode)
			}
			switch tc.wantMethod {
			case http.MethodPost:
				if h.rawQuery != "token=abc&x=1" || h.ctype != "application/x-www-form-urlencoded" {
					t.Errorf("POST query %q content type %q", h.rawQuery, h.ctype)
				}
			case http.MethodGet:
				want := "token=abc&x=1&id=" + id + "&code=" + url.QueryEscape(wantCode)
				if h.rawQuery != want {
					t.Errorf("GET query %q\nwant %q", h.rawQuery, want)
				}
			}
			st := s.Stats()
			if st.PingbacksSent != 1 || st.PingbacksFailed != 0 || st.PingbacksDropped != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

func TestPingbackFaults(t *testing.T) {
	const tasks = 3
	tests := []struct {
		name      string
		cfg       Config
		status    int // receiver status
		wantPerID int
		check     func(t *testing.T, st Stats)
	}{
		{name: "drop all", cfg: Config{DropRate: 1}, wantPerID: 0, check: func(t *testing.T, st Stats) {
			if st.PingbacksDropped != tasks || st.PingbacksSent != 0 {
				t.Errorf("dropped %d sent %d", st.PingbacksDropped, st.PingbacksSent)
			}
		}},
		{name: "duplicate all", cfg: Config{DuplicateRate: 1}, wantPerID: 2, check: func(t *testing.T, st Stats) {
			if st.PingbacksDuplicated != tasks || st.PingbacksSent != 2*tasks {
				t.Errorf("duplicated %d sent %d", st.PingbacksDuplicated, st.PingbacksSent)
			}
		}},
		{name: "drop beats duplicate", cfg: Config{DropRate: 1, DuplicateRate: 1}, wantPerID: 0, check: func(t *testing.T, st Stats) {
			if st.PingbacksDropped != tasks || st.PingbacksDuplicated != 0 {
				t.Errorf("dropped %d duplicated %d", st.PingbacksDropped, st.PingbacksDuplicated)
			}
		}},
		{name: "receiver 500 is not retried", cfg: Config{}, status: http.StatusInternalServerError, wantPerID: 1, check: func(t *testing.T, st Stats) {
			if st.PingbacksFailed != tasks || st.PingbacksSent != tasks {
				t.Errorf("failed %d sent %d", st.PingbacksFailed, st.PingbacksSent)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rc := startReceiver(t, tc.status)
			s, base := startSim(t, tc.cfg)
			var ids []string
			for range tasks {
				ids = append(ids, submit(t, base, "hcaptcha", url.Values{"pingback": {rc.url + "/cb"}}))
			}
			want := int64(tasks * tc.wantPerID)
			testkit.WaitFor(t, 3*time.Second, "tasks solved and pingbacks sent", func() bool {
				st := s.Stats()
				return st.TasksSolved == tasks && st.PingbacksSent == want
			})
			// Close waits for in-flight pingbacks: nothing can arrive later.
			_ = s.Close()
			perID := map[string]int{}
			for _, h := range rc.got() {
				perID[h.id]++
				if info, _ := s.Task(h.id); h.code != info.Code {
					t.Errorf("pingback for %s carried %q, want %q", h.id, h.code, info.Code)
				}
			}
			for _, id := range ids {
				if perID[id] != tc.wantPerID {
					t.Errorf("task %s got %d pingbacks, want %d", id, perID[id], tc.wantPerID)
				}
			}
			tc.check(t, s.Stats())
		})
	}
}

func TestPingbackLate(t *testing.T) {
	const lateDelay = 300 * time.Millisecond
	rc := startReceiver(t, 0)
	s, base := startSim(t, Config{LateRate: 1, LateDelay: lateDelay})
	start := time.Now()
	id := submit(t, base, "userrecaptcha", url.Values{"pingback": {rc.url}})
	testkit.WaitFor(t, 3*time.Second, "solved", func() bool { return s.Stats().TasksSolved == 1 })
	testkit.WaitFor(t, 3*time.Second, "late pingback", func() bool { return rc.count() == 1 })
	// The receiver sees the call before the simulator counts it as sent.
	testkit.WaitFor(t, 3*time.Second, "the pingback counted as sent", func() bool { return s.Stats().PingbacksSent == 1 })
	h := rc.got()[0]
	if h.id != id {
		t.Errorf("pingback for %q, want %q", h.id, id)
	}
	if d := h.at.Sub(start); d < lateDelay {
		t.Errorf("pingback %s after submit, want at least %s", d, lateDelay)
	}
	if st := s.Stats(); st.PingbacksLate != 1 || st.PingbacksSent != 1 {
		t.Errorf("late %d sent %d", st.PingbacksLate, st.PingbacksSent)
	}
}

func TestPingbackUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/cb"
	ln.Close()
	s, base := startSim(t, Config{PingbackTimeout: time.Second})
	submit(t, base, "hcaptcha", url.Values{"pingback": {dead}})
	testkit.WaitFor(t, 3*time.Second, "failed pingback", func() bool { return s.Stats().PingbacksFailed == 1 })
	_ = s.Close()
	if st := s.Stats(); st.PingbacksSent != 1 {
		t.Errorf("sent %d, want exactly one attempt", st.PingbacksSent)
	}
}

func TestCloseCancelsLatePingbacks(t *testing.T) {
	rc := startReceiver(t, 0)
	s, base := startSim(t, Config{LateRate: 1, LateDelay: time.Hour})
	submit(t, base, "hcaptcha", url.Values{"pingback": {rc.url}})
	submit(t, base, "hcaptcha", nil) // no pingback
	testkit.WaitFor(t, 3*time.Second, "solved", func() bool { return s.Stats().TasksSolved == 2 })

	done := make(chan struct{})
	go func() { _ = s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not return")
	}
	if st := s.Stats(); st.PingbacksCancelled != 1 || st.PingbacksSent != 0 || rc.count() != 0 {
		t.Errorf("cancelled %d sent %d received %d", st.PingbacksCancelled, st.PingbacksSent, rc.count())
	}
	// After Close new tasks are accepted but never solved.
	id := submit(t, base, "hcaptcha", nil)
	if s.Solve(id) {
		t.Error("Solve after Close returned true")
	}
	_ = s.Close() // idempotent
}

func TestPingbackFaultsReproducible(t *testing.T) {
	cfg := Config{DropRate: 0.5, DuplicateRate: 0.3, LateRate: 0.2, UnsolvableRate: 0.1,
		SolveMin: never, SolveMax: 2 * never}
	run := func(seed uint64) []string {
		c := cfg
		c.Seed = seed
		s, base := startSim(t, c)
		var out []string
		for range 40 {
			id := submit(t, base, "userrecaptcha", url.Values{"pingback": {"http://127.0.0.1:1/cb"}})
			info, _ := s.Task(id)
			out = append(out, fmt.Sprintf("%s drop=%v dup=%v late=%v unsolvable=%v delay=%s code=%s",
				id, info.PingbackDrop, info.PingbackDuplicate, info.PingbackLate, info.Unsolvable, info.SolveDelay, info.Code))
		}
		return out
	}
	a, b, c := run(42), run(42), run(43)
	if strings.Join(a, "\n") != strings.Join(b, "\n") {
		t.Fatal("same seed gave different tasks")
	}
	if strings.Join(a, "\n") == strings.Join(c, "\n") {
		t.Fatal("different seeds gave the same tasks")
	}
	drops := strings.Count(strings.Join(a, "\n"), "drop=true")
	if drops == 0 || drops == len(a) {
		t.Errorf("DropRate 0.5 dropped %d of %d", drops, len(a))
	}
}
