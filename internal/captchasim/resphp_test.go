package captchasim

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

func TestGetBeforeAndAfterSolving(t *testing.T) {
	tests := []struct {
		name   string
		json   bool
		method string
	}{
		{"plain token", false, "userrecaptcha"},
		{"json token", true, "userrecaptcha"},
		{"plain funcaptcha", false, "funcaptcha"},
		{"json text", true, "base64"},
	}
	s, base := startSim(t, Config{SolveMin: 150 * time.Millisecond, SolveMax: 150 * time.Millisecond})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := submit(t, base, tc.method, nil)
			q := url.Values{"action": {"get"}, "id": {id}}
			if tc.json {
				q.Set("json", "1")
			}
			// readAnswer returns (answer, ready).
			readAnswer := func() (string, bool) {
				r := res(t, base, q)
				if tc.json {
					rep := decodeReply(t, r.body)
					if rep.Status == 0 {
						if got := rep.requestString(t); got != CodeNotReady {
							t.Fatalf("not-ready reply %q", r.body)
						}
						return "", false
					}
					return rep.requestString(t), true
				}
				if r.body == CodeNotReady {
					return "", false
				}
				a, ok := strings.CutPrefix(r.body, "OK|")
				if !ok {
					t.Fatalf("reply %q", r.body)
				}
				return a, true
			}
			if _, ready := readAnswer(); ready {
				t.Fatal("ready right after submit")
			}
			var answer string
			testkit.WaitFor(t, 3*time.Second, "solved", func() bool {
				var ready bool
				answer, ready = readAnswer()
				return ready
			})
			info, _ := s.Task(id)
			if info.State != StateSolved || answer != info.Code {
				t.Errorf("answer %q, task %+v", answer, info)
			}
			// The full answer survives, '|' included (split only on the first '|').
			checkAnswerShape(t, tc.method, answer)
		})
	}
}

func TestUnsolvable(t *testing.T) {
	s, base := startSim(t, Config{SolveMin: never, SolveMax: never, UnsolvableRate: 1})
	id := submit(t, base, "hcaptcha", nil)
	if !s.Solve(id) {
		t.Fatal("Solve returned false")
	}
	if s.Solve(id) {
		t.Error("second Solve returned true")
	}
	for _, tc := range []struct {
		q    url.Values
		want string
	}{
		{url.Values{"action": {"get"}, "id": {id}}, CodeUnsolvable},
		{url.Values{"action": {"get"}, "id": {id}, "json": {"1"}}, `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`},
		{url.Values{"action": {"get2"}, "id": {id}}, CodeUnsolvable},
		{url.Values{"action": {"reportbad"}, "id": {id}}, CodeReportNotRecorded},
	} {
		if r := res(t, base, tc.q); r.body != tc.want {
			t.Errorf("%v: %q, want %q", tc.q, r.body, tc.want)
		}
	}
	if st := s.Stats(); st.TasksUnsolvable != 1 || st.TasksSolved != 0 || st.TasksPending != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestResErrors(t *testing.T) {
	s, base := startSim(t, Config{SolveMin: never, SolveMax: never})
	id := submit(t, base, "hcaptcha", nil)
	tests := []struct {
		name string
		q    url.Values
		want string
	}{
		{"non-digit id", url.Values{"key": {testKey}, "action": {"get"}, "id": {"12a"}}, CodeWrongIDFormat},
		{"empty id", url.Values{"key": {testKey}, "action": {"get"}}, CodeWrongIDFormat},
		{"negative id", url.Values{"key": {testKey}, "action": {"get2"}, "id": {"-5"}}, CodeWrongIDFormat},
		{"unknown id", url.Values{"key": {testKey}, "action": {"get"}, "id": {"12345"}}, CodeWrongCaptchaID},
		{"unknown id json", url.Values{"key": {testKey}, "action": {"get"}, "id": {"12345"}, "json": {"1"}}, `{"status":0,"request":"ERROR_WRONG_CAPTCHA_ID"}`},
		{"bulk bad element", url.Values{"key": {testKey}, "action": {"get"}, "ids": {id + ",x"}}, CodeWrongIDFormat},
		{"bulk empty element", url.Values{"key": {testKey}, "action": {"get"}, "ids": {id + ",,"}}, CodeWrongIDFormat},
		{"wrong key", url.Values{"key": {"nope"}, "action": {"get"}, "id": {id}}, CodeWrongUserKey},
		{"no key", url.Values{"action": {"getbalance"}}, CodeWrongUserKey},
		{"no action", url.Values{"key": {testKey}, "id": {id}}, CodeEmptyAction},
		{"unknown action", url.Values{"key": {testKey}, "action": {"explode"}}, CodeBadParameters},
		{"report unknown", url.Values{"key": {testKey}, "action": {"reportgood"}, "id": {"99"}}, CodeWrongCaptchaID},
		{"report unsolved", url.Values{"key": {testKey}, "action": {"reportgood"}, "id": {id}}, CodeReportNotRecorded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := get(t, base, "res.php", tc.q)
			if r.status != http.StatusOK || r.body != tc.want {
				t.Errorf("status %d body %q, want 200 %q", r.status, r.body, tc.want)
			}
		})
	}
	st := s.Stats()
	if st.ResCalls != int64(len(tests)) || st.ResCallsByAction["none"] != 1 || st.ResCallsByAction["other"] != 1 {
		t.Errorf("stats: %d res calls, by action %v", st.ResCalls, st.ResCallsByAction)
	}
}

func TestBulkGetOrder(t *testing.T) {
	s, base := startSim(t, Config{SolveMin: never, SolveMax: never})
	a := submit(t, base, "userrecaptcha", nil)
	b := submit(t, base, "userrecaptcha", nil)
	c := submit(t, base, "turnstile", nil)
	s.Solve(c)
	s.Solve(a)
	ta, _ := s.Task(a)
	tc, _ := s.Task(c)
	const unknown = "12345"

	tests := []struct {
		name string
		q    url.Values
		want string
	}{
		{"plain", url.Values{"action": {"get"}, "ids": {a + "," + b + "," + c}},
			ta.Code + "|" + CodeNotReady + "|" + tc.Code},
		{"reversed order", url.Values{"action": {"get"}, "ids": {c + "," + b + "," + a}},
			tc.Code + "|" + CodeNotReady + "|" + ta.Code},
		{"spaces and unknown id", url.Values{"action": {"get"}, "ids": {b + ", " + unknown + " ," + a}},
			CodeNotReady + "|" + CodeWrongCaptchaID + "|" + ta.Code},
		{"json", url.Values{"action": {"get"}, "ids": {a + "," + b + "," + c}, "json": {"1"}},
			`{"status":1,"request":"` + ta.Code + "|" + CodeNotReady + "|" + tc.Code + `"}`},
		{"ids wins over id", url.Values{"action": {"get"}, "id": {b}, "ids": {a}}, ta.Code},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if r := res(t, base, tt.q); r.body != tt.want {
				t.Errorf("got %q\nwant %q", r.body, tt.want)
			}
		})
	}
	st := s.Stats()
	if st.BulkCalls != int64(len(tests)) || st.BulkMismatches != 0 {
		t.Errorf("bulk calls %d, mismatches %d", st.BulkCalls, st.BulkMismatches)
	}
	// a is named by every request, b by four, c by three.
	if st.ResCallsPerTaskMax != 5 {
		t.Errorf("per-task max %d, want 5", st.ResCallsPerTaskMax)
	}
	if want := float64(5+4+3) / 3; st.ResCallsPerTaskAvg != want {
		t.Errorf("per-task avg %v, want %v", st.ResCallsPerTaskAvg, want)
	}
}

func TestGet2BalanceReports(t *testing.T) {
	s, base := startSim(t, Config{SolveMin: never, SolveMax: never, Price: "0.00299", Balance: "12.3400"})
	id := submit(t, base, "funcaptcha", nil)
	s.Solve(id)
	info, _ := s.Task(id)
	tests := []struct {
		name string
		q    url.Values
		want string
	}{
		{"get2 plain", url.Values{"action": {"get2"}, "id": {id}}, "OK|" + info.Code + "|0.00299"},
		{"get2 json", url.Values{"action": {"get2"}, "id": {id}, "json": {"1"}},
			`{"status":1,"request":"` + info.Code + `","price":"0.00299"}`},
		{"getbalance plain", url.Values{"action": {"getbalance"}}, "12.3400"},
		{"getbalance json", url.Values{"action": {"getbalance"}, "json": {"1"}}, `{"status":1,"request":"12.3400"}`},
		{"reportgood", url.Values{"action": {"reportgood"}, "id": {id}}, CodeReportRecorded},
		{"reportbad duplicate", url.Values{"action": {"reportbad"}, "id": {id}, "json": {"1"}},
			`{"status":0,"request":"ERROR_DUPLICATE_REPORT"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if r := res(t, base, tc.q); r.body != tc.want {
				t.Errorf("got %q\nwant %q", r.body, tc.want)
			}
		})
	}
	// get2's price is after the last '|', the answer before it keeps its own '|'.
	r := res(t, base, url.Values{"action": {"get2"}, "id": {id}})
	body := strings.TrimPrefix(r.body, "OK|")
	if i := strings.LastIndexByte(body, '|'); body[:i] != info.Code || body[i+1:] != "0.00299" {
		t.Errorf("get2 %q does not split on the last '|'", r.body)
	}
}

func TestResOverPOSTForm(t *testing.T) {
	s, base := startSim(t, Config{SolveMin: never, SolveMax: never})
	id := submit(t, base, "hcaptcha", nil)
	s.Solve(id)
	info, _ := s.Task(id)
	r := postForm(t, base, "res.php", url.Values{"key": {testKey}, "action": {"get"}, "id": {id}})
	if r.body != "OK|"+info.Code {
		t.Errorf("POST res.php: %q", r.body)
	}
	r = postMultipart(t, base, "res.php", url.Values{"key": {testKey}, "action": {"get"}, "id": {id}, "json": {"1"}}, nil)
	if rep := decodeReply(t, r.body); rep.Status != 1 || rep.requestString(t) != info.Code {
		t.Errorf("multipart res.php: %q", r.body)
	}
}

func TestForgetAfter(t *testing.T) {
	tests := []struct {
		name        string
		forgetAfter time.Duration
		advance     time.Duration
		want        string // "answer" or a code
	}{
		{"default just before", 0, 15*time.Minute - time.Second, "answer"},
		{"default at 15m", 0, 15 * time.Minute, CodeWrongCaptchaID},
		{"custom 1m", time.Minute, time.Minute + time.Second, CodeWrongCaptchaID},
		{"disabled", -1, 48 * time.Hour, "answer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			s, base := startSim(t, Config{SolveMin: never, SolveMax: never, Now: clock.Now, ForgetAfter: tc.forgetAfter})
			id := submit(t, base, "userrecaptcha", nil)
			s.Solve(id)
			info, _ := s.Task(id)
			clock.Advance(tc.advance)
			want := tc.want
			if want == "answer" {
				want = "OK|" + info.Code
			}
			for _, action := range []string{"get", "get2", "reportgood"} {
				r := res(t, base, url.Values{"action": {action}, "id": {id}})
				switch {
				case want == CodeWrongCaptchaID && r.body != want:
					t.Errorf("%s after %s: %q, want %q", action, tc.advance, r.body, want)
				case want != CodeWrongCaptchaID && action == "get" && r.body != want:
					t.Errorf("%s after %s: %q, want %q", action, tc.advance, r.body, want)
				}
			}
			_, known := s.Task(id)
			st := s.Stats()
			forgotten := want == CodeWrongCaptchaID
			if known == forgotten || (st.TasksForgotten == 1) != forgotten {
				t.Errorf("Task known %v, forgotten count %d; want forgotten %v", known, st.TasksForgotten, forgotten)
			}
		})
	}
}

func TestForgetPendingTask(t *testing.T) {
	clock := newFakeClock()
	s, base := startSim(t, Config{SolveMin: never, SolveMax: never, Now: clock.Now})
	id := submit(t, base, "hcaptcha", nil)
	clock.Advance(20 * time.Minute)
	if st := s.Stats(); st.TasksForgotten != 1 || st.TasksPending != 0 {
		t.Errorf("stats after forgetting a pending task: %+v", st)
	}
	if s.Solve(id) {
		t.Error("a forgotten task was solved")
	}
}

func TestBudget(t *testing.T) {
	tests := []struct {
		name      string
		allowance int
		perTask   int
		submits   int
		allowed   int // res.php calls answered normally before ERROR: 1005
	}{
		{"allowance 5, one task", 5, 0, 1, 25},
		{"no allowance, two tasks", -1, 0, 2, 40},
		{"per task 3", 2, 3, 2, 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, base := startSim(t, Config{SolveMin: never, SolveMax: never, EnforceBudget: true,
				BudgetAllowance: tc.allowance, BudgetPerTask: tc.perTask})
			for range tc.submits {
				submit(t, base, "hcaptcha", nil)
			}
			for i := range tc.allowed {
				if r := res(t, base, url.Values{"action": {"getbalance"}}); r.body != DefaultBalance {
					t.Fatalf("call %d: %q, want the balance", i+1, r.body)
				}
			}
			if r := res(t, base, url.Values{"action": {"getbalance"}}); r.body != CodeBudget {
				t.Fatalf("call %d: %q, want %q", tc.allowed+1, r.body, CodeBudget)
			}
			if r := res(t, base, url.Values{"action": {"get"}, "id": {"1"}, "json": {"1"}}); r.body != `{"status":0,"request":"ERROR: 1005"}` {
				t.Errorf("json: %q", r.body)
			}
			if st := s.Stats(); st.BudgetBlocks != 2 {
				t.Errorf("budget blocks %d, want 2", st.BudgetBlocks)
			}
			// Submitting more tasks raises the budget again.
			submit(t, base, "hcaptcha", nil)
			if r := res(t, base, url.Values{"action": {"getbalance"}}); r.body != DefaultBalance {
				t.Errorf("after a new submit: %q", r.body)
			}
		})
	}
}

func TestBudgetBlockFor(t *testing.T) {
	clock := newFakeClock()
	_, base := startSim(t, Config{SolveMin: never, SolveMax: never, Now: clock.Now,
		EnforceBudget: true, BudgetAllowance: 1, BudgetPerTask: 1, BudgetBlockFor: 5 * time.Minute})
	call := func() string { return res(t, base, url.Values{"action": {"getbalance"}}).body }
	if got := call(); got != DefaultBalance {
		t.Fatalf("first call: %q", got)
	}
	if got := call(); got != CodeBudget {
		t.Fatalf("second call: %q", got)
	}
	// More submits do not lift a block before it expires.
	for range 5 {
		submit(t, base, "hcaptcha", nil)
	}
	clock.Advance(5*time.Minute - time.Second)
	if got := call(); got != CodeBudget {
		t.Errorf("inside the block: %q", got)
	}
	clock.Advance(time.Second)
	if got := call(); got != DefaultBalance {
		t.Errorf("after the block: %q", got)
	}
}

func TestResFaultInjection(t *testing.T) {
	t.Run("server errors", func(t *testing.T) {
		s, base := startSim(t, Config{SolveMin: never, SolveMax: never, ServerErrorRate: 1, Seed: 3})
		id := submit(t, base, "hcaptcha", nil)
		seen := map[int]bool{}
		for range 30 {
			r := res(t, base, url.Values{"action": {"get"}, "id": {id}, "json": {"1"}})
			if r.status != 500 && r.status != 502 && r.status != 503 {
				t.Fatalf("status %d", r.status)
			}
			if !strings.HasPrefix(r.ctype, "text/html") || !strings.Contains(r.body, "<html>") ||
				!strings.Contains(r.body, http.StatusText(r.status)) {
				t.Fatalf("not an HTML error page: %q %q", r.ctype, r.body)
			}
			seen[r.status] = true
		}
		if len(seen) != 3 {
			t.Errorf("statuses seen %v, want all of 500, 502, 503", seen)
		}
		if st := s.Stats(); st.ServerErrors != 30 || st.ResCalls != 30 {
			t.Errorf("server errors %d, res calls %d", st.ServerErrors, st.ResCalls)
		}
	})
	t.Run("submit server errors", func(t *testing.T) {
		s, base := startSim(t, Config{SolveMin: never, SolveMax: never, SubmitServerErrorRate: 1})
		r := get(t, base, "in.php", url.Values{"key": {testKey}, "method": {"hcaptcha"}})
		if r.status < 500 || !strings.Contains(r.body, "<html>") {
			t.Errorf("status %d body %q", r.status, r.body)
		}
		if st := s.Stats(); st.ServerErrors != 1 || st.Submits != 0 {
			t.Errorf("stats %+v", st)
		}
	})
	t.Run("no slot", func(t *testing.T) {
		s, base := startSim(t, Config{SolveMin: never, SolveMax: never, NoSlotRate: 1, SubmitNoSlotRate: 0})
		id := submit(t, base, "hcaptcha", nil)
		if r := res(t, base, url.Values{"action": {"get"}, "id": {id}}); r.body != CodeNoSlot {
			t.Errorf("got %q", r.body)
		}
		if r := res(t, base, url.Values{"action": {"get"}, "id": {id}, "json": {"1"}}); r.body != `{"status":0,"request":"ERROR_NO_SLOT_AVAILABLE"}` {
			t.Errorf("got %q", r.body)
		}
		if st := s.Stats(); st.NoSlots != 2 {
			t.Errorf("no slots %d", st.NoSlots)
		}
	})
	t.Run("submit no slot", func(t *testing.T) {
		_, base := startSim(t, Config{SolveMin: never, SolveMax: never, SubmitNoSlotRate: 1})
		r := get(t, base, "in.php", url.Values{"key": {testKey}, "method": {"hcaptcha"}})
		if r.body != CodeNoSlot {
			t.Errorf("got %q", r.body)
		}
	})
	t.Run("bulk mismatch", func(t *testing.T) {
		s, base := startSim(t, Config{SolveMin: never, SolveMax: never, BulkMismatchRate: 1})
		var ids []string
		for range 4 {
			ids = append(ids, submit(t, base, "hcaptcha", nil))
		}
		for n := 1; n <= 4; n++ {
			r := res(t, base, url.Values{"action": {"get"}, "ids": {strings.Join(ids[:n], ",")}})
			if got := len(strings.Split(r.body, "|")); got == n {
				t.Errorf("%d ids answered with %d elements %q", n, got, r.body)
			}
		}
		if st := s.Stats(); st.BulkMismatches != 4 {
			t.Errorf("bulk mismatches %d", st.BulkMismatches)
		}
		// A single-id get is not a bulk call and is never mangled.
		if r := res(t, base, url.Values{"action": {"get"}, "id": {ids[0]}}); r.body != CodeNotReady {
			t.Errorf("single get %q", r.body)
		}
	})
}
