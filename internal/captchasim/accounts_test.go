package captchasim

import (
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// resAs calls res.php by GET with key.
func resAs(t *testing.T, base, key string, vals url.Values) response {
	t.Helper()
	vals.Set("key", key)
	return get(t, base, "res.php", vals)
}

// submitAs submits a task with key and returns its id.
func submitAs(t *testing.T, base, key, method string, extra url.Values) string {
	t.Helper()
	vals := url.Values{"key": {key}}
	for k, v := range extra {
		vals[k] = v
	}
	return submit(t, base, method, vals)
}

// createAs creates a JSON API task with key and returns its id.
func createAs(t *testing.T, base, key, callback string) string {
	t.Helper()
	body := `{"clientKey":"` + key + `","task":{"type":"RecaptchaV2TaskProxyless","websiteURL":"https://a.example","websiteKey":"k"}`
	if callback != "" {
		body += `,"callbackUrl":"` + callback + `"`
	}
	got, _ := postJSON(t, base, "createTask", body+"}")
	switch id := got["taskId"].(type) {
	case json.Number:
		return id.String()
	case string:
		return id
	}
	t.Fatalf("createTask with a %d-character key: %v", len(key), got)
	return ""
}

// taskIDJSON is id as the flavor's getTaskResult request carries it.
func taskIDJSON(flavor, id string) string {
	if flavor == FlavorCapSolver {
		return `"` + id + `"`
	}
	return id
}

func TestNewKeys(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		wantErr  string
		wantKey  string
		accounts int
	}{
		{"one key", Config{Key: testKey}, "", testKey, 1},
		{"two keys", Config{Key: testKey, Keys: []string{otherKey}}, "", testKey, 2},
		{"three keys", Config{Key: testKey, Keys: []string{otherKey, bannedKey}}, "", testKey, 3},
		{"default key first", Config{Keys: []string{otherKey}}, "", DefaultKey, 2},
		{"empty entry", Config{Key: testKey, Keys: []string{otherKey, ""}}, "keys[1] is empty", "", 0},
		{"key repeated in keys", Config{Key: testKey, Keys: []string{otherKey, testKey}}, "key and keys[1] are the same key", "", 0},
		{"keys repeated", Config{Key: testKey, Keys: []string{otherKey, bannedKey, otherKey}}, "keys[0] and keys[2] are the same key", "", 0},
		{"default key repeated", Config{Keys: []string{DefaultKey}}, "key and keys[0] are the same key", "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.cfg)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("New error %v, want %q", err, tc.wantErr)
				}
				for _, k := range []string{testKey, otherKey, bannedKey, DefaultKey} {
					if strings.Contains(err.Error(), k) {
						t.Errorf("error %q names a key", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer s.Close()
			c := s.Config()
			if c.Key != tc.wantKey || !slices.Equal(c.Keys, tc.cfg.Keys) {
				t.Errorf("config key %q keys %q", c.Key, c.Keys)
			}
			accounts := s.Accounts()
			if len(accounts) != tc.accounts {
				t.Fatalf("%d accounts, want %d", len(accounts), tc.accounts)
			}
			for i, a := range accounts {
				if a.Account != i {
					t.Errorf("account %d numbered %d", i, a.Account)
				}
			}
			c.Keys = append(c.Keys[:0], "changed")
			if got := s.Config().Keys; !slices.Equal(got, tc.cfg.Keys) {
				t.Errorf("changing Config().Keys changed the sim's keys to %q", got)
			}
		})
	}
}

func TestAccountOwnershipResPHP(t *testing.T) {
	s, base := startSim(t, Config{Key: testKey, Keys: []string{otherKey}, SolveMin: never, SolveMax: never})
	a := submitAs(t, base, testKey, "userrecaptcha", nil)
	b := submitAs(t, base, otherKey, "userrecaptcha", nil)
	c := submitAs(t, base, testKey, "hcaptcha", nil)
	s.Solve(a)
	s.Solve(b)
	ta, _ := s.Task(a)
	tb, _ := s.Task(b)
	if ta.Account != 0 || tb.Account != 1 {
		t.Fatalf("accounts of the tasks: %d and %d, want 0 and 1", ta.Account, tb.Account)
	}
	const unknown = "12345"

	tests := []struct {
		name    string
		key     string
		q       url.Values
		want    string
		foreign int // ids of the other account's tasks named
	}{
		{"own get", testKey, url.Values{"action": {"get"}, "id": {a}}, "OK|" + ta.Code, 0},
		{"own get other account", otherKey, url.Values{"action": {"get"}, "id": {b}}, "OK|" + tb.Code, 0},
		{"get of the other account's task", otherKey, url.Values{"action": {"get"}, "id": {a}}, CodeWrongCaptchaID, 1},
		{"get of the other account's task, first key", testKey, url.Values{"action": {"get"}, "id": {b}}, CodeWrongCaptchaID, 1},
		{"json", otherKey, url.Values{"action": {"get"}, "id": {a}, "json": {"1"}}, `{"status":0,"request":"ERROR_WRONG_CAPTCHA_ID"}`, 1},
		{"pending task of the other account", otherKey, url.Values{"action": {"get"}, "id": {c}}, CodeWrongCaptchaID, 1},
		{"get2", otherKey, url.Values{"action": {"get2"}, "id": {a}}, CodeWrongCaptchaID, 1},
		{"own get2", otherKey, url.Values{"action": {"get2"}, "id": {b}}, "OK|" + tb.Code + "|" + DefaultPrice, 0},
		{"reportbad", testKey, url.Values{"action": {"reportbad"}, "id": {b}}, CodeWrongCaptchaID, 1},
		{"unknown id", otherKey, url.Values{"action": {"get"}, "id": {unknown}}, CodeWrongCaptchaID, 0},
		{"bulk, first key", testKey, url.Values{"action": {"get"}, "ids": {a + "," + b + "," + c}},
			ta.Code + "|" + CodeWrongCaptchaID + "|" + CodeNotReady, 1},
		{"bulk, other key", otherKey, url.Values{"action": {"get"}, "ids": {a + "," + b + "," + c + "," + unknown}},
			CodeWrongCaptchaID + "|" + tb.Code + "|" + CodeWrongCaptchaID + "|" + CodeWrongCaptchaID, 2},
		{"bulk json", otherKey, url.Values{"action": {"get"}, "ids": {b + "," + a}, "json": {"1"}},
			`{"status":1,"request":"` + tb.Code + "|" + CodeWrongCaptchaID + `"}`, 1},
		{"bulk of foreign ids only", testKey, url.Values{"action": {"get"}, "ids": {b + "," + b}},
			CodeWrongCaptchaID + "|" + CodeWrongCaptchaID, 2},
		{"unknown key", "ffffffffffffffffffffffffffffffff", url.Values{"action": {"get"}, "id": {a}}, CodeWrongUserKey, 0},
	}
	var want keyCalls
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := resAs(t, base, tc.key, tc.q)
			if r.status != http.StatusOK || r.body != tc.want {
				t.Errorf("status %d body %q, want 200 %q", r.status, r.body, tc.want)
			}
		})
		want.add(tc.key, tc.foreign)
	}
	for i, k := range []string{testKey, otherKey} {
		st, ok := s.KeyStats(k)
		if !ok || st.Account != i || st.ForeignTaskCalls != want.foreign[i] || st.ResCalls != want.calls[i] {
			t.Errorf("account %d: %+v, want %d res calls and %d foreign task calls", i, st, want.calls[i], want.foreign[i])
		}
	}
	if _, ok := s.KeyStats("ffffffffffffffffffffffffffffffff"); ok {
		t.Error("KeyStats of an unknown key")
	}
	// Only the own account's calls count against a task: a by own get and
	// the first key's bulk; b by two own gets, get2 and the two own bulks.
	ta, _ = s.Task(a)
	tb, _ = s.Task(b)
	if ta.ResCalls != 2 || tb.ResCalls != 4 {
		t.Errorf("res calls per task: a %d (want 2), b %d (want 4)", ta.ResCalls, tb.ResCalls)
	}
	if st := s.Stats(); st.UnknownKeyResCalls != 1 || st.ResCalls != int64(len(tests)) {
		t.Errorf("totals: %d res calls, %d with an unknown key", st.ResCalls, st.UnknownKeyResCalls)
	}
}

// keyCalls tallies the calls a test makes per key (testKey at 0, otherKey
// at 1) and the other account's task ids they name (foreign), as KeyStats
// should count them.
type keyCalls struct{ calls, foreign [2]int64 }

// add counts one call made with key that named foreign ids of the other
// account's tasks; a call with another key counts for neither.
func (c *keyCalls) add(key string, foreign int) {
	for i, k := range []string{testKey, otherKey} {
		if key == k {
			c.foreign[i] += int64(foreign)
			c.calls[i]++
		}
	}
}

func TestAccountOwnershipJSON(t *testing.T) {
	for _, flavor := range []string{FlavorAntiCaptcha, FlavorCapSolver, Flavor2Captcha} {
		t.Run(flavor, func(t *testing.T) {
			s, base := startSim(t, Config{Key: testKey, Keys: []string{otherKey}, JSONFlavor: flavor, SolveMin: never, SolveMax: never})
			a := createAs(t, base, testKey, "")
			b := createAs(t, base, otherKey, "")
			c := createAs(t, base, otherKey, "")
			legacy := submitAs(t, base, otherKey, "userrecaptcha", nil)
			s.Solve(a)
			s.Solve(b)
			ta, _ := s.Task(a)
			tb, _ := s.Task(b)
			if ta.Account != 0 || tb.Account != 1 {
				t.Fatalf("accounts of the tasks: %d and %d, want 0 and 1", ta.Account, tb.Account)
			}
			tests := []struct {
				name    string
				key, id string
				status  string // "ready" or "processing"; "" for an error
				token   string
				code    string
				errorID string
				foreign int
			}{
				{"own task", testKey, a, "ready", ta.Code, "", "", 0},
				{"own task, other account", otherKey, b, "ready", tb.Code, "", "", 0},
				{"own pending task", otherKey, c, "processing", "", "", "", 0},
				{"the other account's task", otherKey, a, "", "", CodeNoSuchCaptchaID, "16", 1},
				{"the other account's task, first key", testKey, b, "", "", CodeNoSuchCaptchaID, "16", 1},
				{"the other account's pending task", testKey, c, "", "", CodeNoSuchCaptchaID, "16", 1},
				{"in.php task", otherKey, legacy, "", "", CodeNoSuchCaptchaID, "16", 0},
				{"unknown key", "ffffffffffffffffffffffffffffffff", a, "", "", CodeKeyDoesNotExist, "1", 0},
			}
			var want keyCalls
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					got, _ := postJSON(t, base, "getTaskResult", `{"clientKey":"`+tc.key+`","taskId":`+taskIDJSON(flavor, tc.id)+`}`)
					if tc.status == "" {
						if got["errorCode"] != tc.code || got["errorId"] != json.Number(tc.errorID) {
							t.Errorf("answer %v, want errorId %s %s", got, tc.errorID, tc.code)
						}
						return
					}
					sol, _ := got["solution"].(map[string]any)
					if got["errorId"] != json.Number("0") || got["status"] != tc.status || tc.token != "" && sol["gRecaptchaResponse"] != tc.token {
						t.Errorf("answer %v, want %s %q", got, tc.status, tc.token)
					}
				})
				want.add(tc.key, tc.foreign)
			}
			for i, k := range []string{testKey, otherKey} {
				st, _ := s.KeyStats(k)
				wantCreates := int64(1 + i) // testKey created a, otherKey b and c
				if st.ForeignTaskCalls != want.foreign[i] || st.GetTaskResultCalls != want.calls[i] ||
					st.CreateTaskCalls != wantCreates || st.Submits != wantCreates+int64(i) {
					t.Errorf("account %d: %+v, want %d getTaskResult calls, %d foreign, %d createTask calls",
						i, st, want.calls[i], want.foreign[i], wantCreates)
				}
			}
			if ta, _ := s.Task(a); ta.ResCalls != 1 {
				t.Errorf("task a counted %d calls, want 1 (its own key's)", ta.ResCalls)
			}
		})
	}
}

// TestAccountPingbacks: a task of a further account is called back as any
// task is, in both API families.
func TestAccountPingbacks(t *testing.T) {
	t.Run("in.php", func(t *testing.T) {
		rc := startReceiver(t, 0)
		s, base := startSim(t, Config{Key: testKey, Keys: []string{otherKey}, SolveMin: never, SolveMax: never})
		id := submitAs(t, base, otherKey, "userrecaptcha", url.Values{"pingback": {rc.url + "/pb?s=1"}})
		s.Solve(id)
		testkit.WaitFor(t, 5*time.Second, "the pingback", func() bool { return rc.count() == 1 })
		info, _ := s.Task(id)
		h := rc.got()[0]
		if h.method != http.MethodPost || h.path != "/pb" || h.rawQuery != "s=1" || h.id != id || h.code != info.Code {
			t.Errorf("pingback %+v, want POST /pb?s=1 id=%s code=%s", h, id, info.Code)
		}
	})
	t.Run("createTask", func(t *testing.T) {
		rc := startJSONReceiver(t)
		s, base := startSim(t, Config{Key: testKey, Keys: []string{otherKey}, SolveMin: never, SolveMax: never})
		id := createAs(t, base, otherKey, rc.url)
		s.Solve(id)
		testkit.WaitFor(t, 5*time.Second, "the callback", func() bool { b, _ := rc.bodies(); return len(b) == 1 })
		bodies, types := rc.bodies()
		info, _ := s.Task(id)
		var cb struct {
			TaskID   json.Number       `json:"taskId"`
			Status   string            `json:"status"`
			Solution map[string]string `json:"solution"`
		}
		if err := json.Unmarshal([]byte(bodies[0]), &cb); err != nil || types[0] != "application/json" ||
			cb.TaskID.String() != id || cb.Status != "ready" || cb.Solution["gRecaptchaResponse"] != info.Code {
			t.Errorf("callback %s %q (%v), want task %s ready with %s", types[0], bodies[0], err, id, info.Code)
		}
	})
}

// budgetStep is one request of a budget scenario.
type budgetStep struct {
	key    string
	submit bool   // in.php submit instead of res.php getbalance
	want   string // getbalance answer: DefaultBalance or CodeBudget
}

func TestBudgetPerAccount(t *testing.T) {
	const unknown = "ffffffffffffffffffffffffffffffff"
	ok, blocked := DefaultBalance, CodeBudget
	tests := []struct {
		name   string
		steps  []budgetStep
		blocks [2]int64 // budget blocks per account
	}{
		{
			// Allowance 2 each; one account out of it does not block the other.
			name: "accounts are counted apart",
			steps: []budgetStep{
				{key: testKey, want: ok}, {key: testKey, want: ok}, {key: testKey, want: blocked},
				{key: otherKey, want: ok}, {key: otherKey, want: ok}, {key: otherKey, want: blocked},
				{key: testKey, want: blocked},
			},
			blocks: [2]int64{2, 1},
		},
		{
			// A task raises its own account's allowance only.
			name: "tasks raise their own account's allowance",
			steps: []budgetStep{
				{key: otherKey, submit: true},
				{key: testKey, want: ok}, {key: testKey, want: ok}, {key: testKey, want: blocked},
				{key: otherKey, want: ok}, {key: otherKey, want: ok}, {key: otherKey, want: ok}, {key: otherKey, want: blocked},
			},
			blocks: [2]int64{1, 1},
		},
		{
			// Requests without an accepted key are charged to account 0.
			name: "unknown keys count for the first account",
			steps: []budgetStep{
				{key: unknown, want: CodeWrongUserKey}, {key: "", want: CodeWrongUserKey},
				{key: testKey, want: blocked}, {key: unknown, want: blocked},
				{key: otherKey, want: ok}, {key: otherKey, want: ok},
			},
			blocks: [2]int64{1, 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, base := startSim(t, Config{Key: testKey, Keys: []string{otherKey}, SolveMin: never, SolveMax: never,
				EnforceBudget: true, BudgetAllowance: 2, BudgetPerTask: 1})
			for i, st := range tc.steps {
				if st.submit {
					submitAs(t, base, st.key, "hcaptcha", nil)
					continue
				}
				vals := url.Values{"action": {"getbalance"}}
				if st.key != "" {
					vals.Set("key", st.key)
				}
				if r := get(t, base, "res.php", vals); r.body != st.want {
					t.Fatalf("step %d (account key %d chars): %q, want %q", i, len(st.key), r.body, st.want)
				}
			}
			for i, k := range []string{testKey, otherKey} {
				if st, _ := s.KeyStats(k); st.BudgetBlocks != tc.blocks[i] {
					t.Errorf("account %d: %d budget blocks, want %d", i, st.BudgetBlocks, tc.blocks[i])
				}
			}
		})
	}
}

func TestBudgetBlockForPerAccount(t *testing.T) {
	clock := newFakeClock()
	_, base := startSim(t, Config{Key: testKey, Keys: []string{otherKey}, SolveMin: never, SolveMax: never, Now: clock.Now,
		EnforceBudget: true, BudgetAllowance: 1, BudgetPerTask: 1, BudgetBlockFor: 5 * time.Minute})
	call := func(key string) string { return resAs(t, base, key, url.Values{"action": {"getbalance"}}).body }
	if got := call(testKey); got != DefaultBalance {
		t.Fatalf("first call: %q", got)
	}
	if got := call(testKey); got != CodeBudget {
		t.Fatalf("second call: %q", got)
	}
	// Five tasks lift the first account's limit to 6, but not its block.
	for range 5 {
		submit(t, base, "hcaptcha", nil)
	}
	clock.Advance(time.Minute)
	for i, want := range []string{DefaultBalance, DefaultBalance, CodeBudget} {
		// The other account submitted nothing: allowance 1, then a block of
		// its own; a submit of the first account does not change it.
		if i == 1 {
			submitAs(t, base, otherKey, "hcaptcha", nil)
		}
		if got := call(otherKey); got != want {
			t.Errorf("other account call %d: %q, want %q", i+1, got, want)
		}
	}
	if got := call(testKey); got != CodeBudget {
		t.Errorf("first account inside its block: %q", got)
	}
	clock.Advance(4 * time.Minute)
	if got := call(testKey); got != DefaultBalance {
		t.Errorf("first account after its block: %q", got)
	}
	if got := call(otherKey); got != CodeBudget {
		t.Errorf("other account inside its block: %q", got)
	}
}

func TestKeyFaults(t *testing.T) {
	type want struct {
		res      string // res.php action=get of the account's own solved task
		jsonCode string // getTaskResult errorCode, "" for the result
		jsonID   string
		submit   string // in.php answer code, "" when accepted
		create   string // createTask errorCode, "" when accepted
		faults   int64  // FaultAnswers after the checks below
	}
	tests := []struct {
		name  string
		fault func(s *Sim, key string) error
		want  want
	}{
		{"ban", func(s *Sim, key string) error { return s.BanKey(key) },
			want{res: CodeIPBanned, jsonCode: CodeIPBlocked, jsonID: "21", submit: CodeIPBanned, create: CodeIPBlocked, faults: 7}},
		{"no slot, polls only", func(s *Sim, key string) error {
			return s.SetKeyFault(key, KeyFault{Code: CodeNoSlot, JSONCode: CodeNoSlot})
		}, want{res: CodeNoSlot, jsonCode: CodeNoSlot, jsonID: "2", faults: 5}},
		{"revoked key", func(s *Sim, key string) error {
			return s.SetKeyFault(key, KeyFault{Code: CodeKeyDoesNotExist, JSONCode: CodeKeyDoesNotExist, Submits: true})
		}, want{res: CodeKeyDoesNotExist, jsonCode: CodeKeyDoesNotExist, jsonID: "1", submit: CodeKeyDoesNotExist, create: CodeKeyDoesNotExist, faults: 7}},
		{"legacy 1004 only", func(s *Sim, key string) error {
			return s.SetKeyFault(key, KeyFault{Code: "ERROR: 1004"})
		}, want{res: "ERROR: 1004", faults: 3}},
		{"zero balance, JSON only", func(s *Sim, key string) error {
			return s.SetKeyFault(key, KeyFault{JSONCode: CodeZeroBalance, Submits: true})
		}, want{jsonCode: CodeZeroBalance, jsonID: "10", create: CodeZeroBalance, faults: 3}},
		{"too much requests", func(s *Sim, key string) error {
			return s.SetKeyFault(key, KeyFault{JSONCode: CodeTooMuchRequests})
		}, want{jsonCode: CodeTooMuchRequests, jsonID: "3", faults: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, base := startSim(t, Config{Key: testKey, Keys: []string{otherKey}, SolveMin: never, SolveMax: never})
			legacy := [2]string{submitAs(t, base, testKey, "userrecaptcha", nil), submitAs(t, base, otherKey, "userrecaptcha", nil)}
			api := [2]string{createAs(t, base, testKey, ""), createAs(t, base, otherKey, "")}
			for _, id := range append(legacy[:], api[:]...) {
				s.Solve(id)
			}
			if err := tc.fault(s, otherKey); err != nil {
				t.Fatal(err)
			}
			// check asks every endpoint as account i and compares with the
			// fault when faulty is set, else with normal answers.
			check := func(i int, key string, faulty bool) {
				t.Helper()
				w := want{}
				if faulty {
					w = tc.want
				}
				info, _ := s.Task(legacy[i])
				wantRes := "OK|" + info.Code
				if w.res != "" {
					wantRes = w.res
				}
				if r := resAs(t, base, key, url.Values{"action": {"get"}, "id": {legacy[i]}}); r.body != wantRes {
					t.Errorf("account %d res.php get: %q, want %q", i, r.body, wantRes)
				}
				wantJSON := `{"status":1,"request":"` + info.Code + `"}`
				if w.res != "" {
					wantJSON = `{"status":0,"request":"` + w.res + `"}`
				}
				if r := resAs(t, base, key, url.Values{"action": {"get"}, "ids": {legacy[i]}, "json": {"1"}}); r.body != wantJSON {
					t.Errorf("account %d bulk json: %q, want %q", i, r.body, wantJSON)
				}
				wantBalance := DefaultBalance
				if w.res != "" {
					wantBalance = w.res
				}
				if r := resAs(t, base, key, url.Values{"action": {"getbalance"}}); r.body != wantBalance {
					t.Errorf("account %d getbalance: %q, want %q", i, r.body, wantBalance)
				}
				got, _ := postJSON(t, base, "getTaskResult", `{"clientKey":"`+key+`","taskId":`+api[i]+`}`)
				if w.jsonCode != "" {
					if got["errorCode"] != w.jsonCode || got["errorId"] != json.Number(w.jsonID) {
						t.Errorf("account %d getTaskResult: %v, want errorId %s %s", i, got, w.jsonID, w.jsonCode)
					}
				} else if got["status"] != "ready" {
					t.Errorf("account %d getTaskResult: %v, want the result", i, got)
				}
				got, _ = postJSON(t, base, "getBalance", `{"clientKey":"`+key+`"}`)
				if w.jsonCode != "" && (got["errorCode"] != w.jsonCode || got["errorId"] != json.Number(w.jsonID) || got["balance"] != nil) ||
					w.jsonCode == "" && (got["errorId"] != json.Number("0") || got["balance"] != json.Number("50.25")) {
					t.Errorf("account %d getBalance: %v, want code %q", i, got, w.jsonCode)
				}
				r := get(t, base, "in.php", url.Values{"key": {key}, "method": {"hcaptcha"}})
				if w.submit == "" && !strings.HasPrefix(r.body, "OK|") || w.submit != "" && r.body != w.submit {
					t.Errorf("account %d in.php: %q, want %q", i, r.body, w.submit)
				}
				got, _ = postJSON(t, base, "createTask", `{"clientKey":"`+key+`","task":{"type":"NoCaptchaTask"}}`)
				if w.create == "" && (got["errorId"] != json.Number("0") || got["taskId"] == nil) ||
					w.create != "" && (got["errorCode"] != w.create || got["taskId"] != nil) {
					t.Errorf("account %d createTask: %v, want code %q", i, got, w.create)
				}
			}
			check(0, testKey, false)
			check(1, otherKey, true)
			if st, _ := s.KeyStats(otherKey); st.FaultAnswers != tc.want.faults {
				t.Errorf("fault answers %d, want %d", st.FaultAnswers, tc.want.faults)
			}
			if st, _ := s.KeyStats(testKey); st.FaultAnswers != 0 {
				t.Errorf("the first account got %d fault answers", st.FaultAnswers)
			}
			if err := s.SetKeyFault(otherKey, KeyFault{}); err != nil {
				t.Fatal(err)
			}
			check(1, otherKey, false)
		})
	}
}

func TestSetKeyFaultErrors(t *testing.T) {
	s, err := New(Config{Key: testKey, Keys: []string{otherKey}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tests := []struct {
		name    string
		key     string
		fault   KeyFault
		wantErr string
	}{
		{"unknown key", "ffffffffffffffffffffffffffffffff", KeyFault{Code: CodeIPBanned}, "key is not one of the simulator's accounts"},
		{"empty key", "", KeyFault{}, "key is not one of the simulator's accounts"},
		{"pipe in code", otherKey, KeyFault{Code: "ERROR|X"}, "is not printable ASCII"},
		{"ok answer", otherKey, KeyFault{Code: "OK|12"}, "is not printable ASCII"},
		{"newline", otherKey, KeyFault{Code: "ERROR\nX"}, "is not printable ASCII"},
		{"json code without number", otherKey, KeyFault{JSONCode: "ERROR_SOMETHING"}, "json fault code"},
		{"json task-final code", otherKey, KeyFault{JSONCode: CodeUnsolvable}, "json fault code"},
		{"valid", otherKey, KeyFault{Code: "ERROR: 1001", JSONCode: CodeIPBlocked}, ""},
		{"lift", otherKey, KeyFault{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := s.SetKeyFault(tc.key, tc.fault)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("SetKeyFault: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("SetKeyFault error %v, want one with %q", err, tc.wantErr)
			}
			if tc.key != "" && strings.Contains(err.Error(), tc.key) {
				t.Errorf("error %q names the key", err)
			}
		})
	}
	if err := s.BanKey("ffffffffffffffffffffffffffffffff"); err == nil {
		t.Error("BanKey of an unknown key succeeded")
	}
}

func TestAccountStatsEndpoint(t *testing.T) {
	s, base := startSim(t, Config{Key: testKey, Keys: []string{otherKey}, SolveMin: never, SolveMax: never})
	a := submitAs(t, base, testKey, "userrecaptcha", nil)
	b := submitAs(t, base, otherKey, "userrecaptcha", nil)
	createAs(t, base, otherKey, "")
	get(t, base, "in.php", url.Values{"key": {"wrong"}, "method": {"hcaptcha"}})
	resAs(t, base, testKey, url.Values{"action": {"get"}, "id": {a}})
	resAs(t, base, otherKey, url.Values{"action": {"get"}, "id": {a}})
	resAs(t, base, otherKey, url.Values{"action": {"get"}, "ids": {a + "," + b}})
	resAs(t, base, otherKey, url.Values{"action": {"getbalance"}})
	resAs(t, base, "wrong", url.Values{"action": {"get"}, "id": {b}})
	postJSON(t, base, "getTaskResult", `{"clientKey":"`+otherKey+`","taskId":`+b+`}`)
	if err := s.BanKey(otherKey); err != nil {
		t.Fatal(err)
	}
	resAs(t, base, otherKey, url.Values{"action": {"get"}, "id": {b}})

	r := get(t, base, "stats", nil)
	if r.status != http.StatusOK || r.ctype != "application/json" {
		t.Fatalf("GET /stats: %d %q", r.status, r.ctype)
	}
	for _, k := range []string{testKey, otherKey} {
		if strings.Contains(r.body, k) {
			t.Fatalf("/stats holds a key: %s", r.body)
		}
	}
	var got struct {
		Stats
		Accounts []AccountStats `json:"accounts"`
	}
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
	want := []AccountStats{
		{Account: 0, InCalls: 1, Submits: 1, ResCalls: 1, ResCallsByAction: map[string]int64{"get": 1}},
		{Account: 1, InCalls: 1, Submits: 2, ResCalls: 4, ResCallsByAction: map[string]int64{"get": 3, "getbalance": 1},
			BulkCalls: 1, CreateTaskCalls: 1, GetTaskResultCalls: 1, FaultAnswers: 1, ForeignTaskCalls: 2},
	}
	if !reflect.DeepEqual(got.Accounts, want) {
		t.Errorf("/stats accounts\n got %+v\nwant %+v", got.Accounts, want)
	}
	if api := s.Accounts(); !reflect.DeepEqual(api, want) {
		t.Errorf("Accounts()\n got %+v\nwant %+v", api, want)
	}
	if got.ResCalls != 6 || got.UnknownKeyResCalls != 1 || got.Submits != 3 || got.InCalls != 3 {
		t.Errorf("totals %+v", got.Stats)
	}
	for _, key := range []string{`"accounts":`, `"foreign_task_calls":`, `"fault_answers":`, `"unknown_key_res_calls":`} {
		if !strings.Contains(r.body, key) {
			t.Errorf("/stats lacks %s: %s", key, r.body)
		}
	}
}
