package pingback

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testfs"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// Two accounts of one provider, and a key this Caddy does not have: long
// random strings like real keys, so that none is a part of another.
const (
	keyA       = "a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1"
	keyB       = "b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2"
	keyForeign = "f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3f3"
)

// submitWith submits n tasks of method to provider's track route with
// key, one after the other.
func submitWith(t *testing.T, provider, key, method string, n int) []pollerTask {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	var out []pollerTask
	for range n {
		id, err := pollerSubmit(client, testBase+"/api/"+provider, key, method, false, nil)
		if err != nil {
			t.Fatalf("submit with %s: %v", provider, err)
		}
		out = append(out, pollerTask{provider: provider, method: method, id: id})
	}
	return out
}

// keyStats returns the simulator's counters of key.
func keyStats(t *testing.T, sim *captchasim.Sim, key string) captchasim.AccountStats {
	t.Helper()
	s, ok := sim.KeyStats(key)
	if !ok {
		t.Fatalf("the simulator does not accept key %.4s…", key)
	}
	return s
}

// checkAccount fails unless every task of tasks is stored with the
// account of key.
func checkAccount(t *testing.T, tasks []pollerTask, key string) {
	t.Helper()
	for _, pt := range tasks {
		if got, want := getTask(t, pt).Account, accountID(pt.provider, key); got != want {
			t.Errorf("%s: account %q, want %q", pt.key(), got, want)
		}
	}
}

// TestAccountsEachRecoveredWithOwnKey: two accounts of one provider, every
// pingback dropped: each account's tasks are recovered by polling with
// that account's own key (the simulator refuses a task's result to the
// other key, so a task asked with the wrong key would expire), through
// res.php (bulk and single) and getTaskResult.
func TestAccountsEachRecoveredWithOwnKey(t *testing.T) {
	t.Run("res.php", func(t *testing.T) {
		sim := newPollerSim(t, captchasim.Config{Seed: 31, DropRate: 1, Key: keyA, Keys: []string{keyB}, SolveMax: 300 * time.Millisecond})
		app := newAppStub(t)
		startPollerCaddy(t, pollBlock("after 1s", "interval 5s"), app,
			pollerRoute{provider: "2captcha", sim: sim, apiKey: keyA + " " + keyB})
		ofA := append(submitWith(t, "2captcha", keyA, "userrecaptcha", 3), submitWith(t, "2captcha", keyA, "post", 1)...)
		ofB := append(submitWith(t, "2captcha", keyB, "userrecaptcha", 3), submitWith(t, "2captcha", keyB, "post", 1)...)
		all := append(append([]pollerTask{}, ofA...), ofB...)
		checkAccount(t, ofA, keyA)
		checkAccount(t, ofB, keyB)
		testkit.WaitFor(t, 2*testPollInterval+pollSlack, "every result recovered", func() bool { return allReceived(app, all) })
		got := receivedOnce(t, app, all)
		for _, pt := range all {
			checkPolled(t, got[pt.key()], pt, "/cb/2captcha", sim.code(t, pt.id))
		}
		for name, key := range map[string]string{"A": keyA, "B": keyB} {
			s := keyStats(t, sim.Sim, key)
			if s.ResCalls == 0 || s.ForeignTaskCalls != 0 {
				t.Errorf("account %s: %d res.php requests, %d for another account's task; want some, none", name, s.ResCalls, s.ForeignTaskCalls)
			}
		}
	})
	t.Run("getTaskResult", func(t *testing.T) {
		const provider = "anticaptcha"
		sim := newJSONSim(t, captchasim.Config{JSONFlavor: captchasim.FlavorAntiCaptcha, DropRate: 1, Key: keyA, Keys: []string{keyB},
			SolveMin: 200 * time.Millisecond, SolveMax: 500 * time.Millisecond, Seed: 32})
		app := newAppStub(t)
		cfg := jsonCaddyfile(t.TempDir(), t.TempDir()+"/caddy.log", provider, pollBlock("after 1s", "interval 5s"), sim, app, "")
		cfg = strings.Replace(cfg, "api_key "+captchasim.DefaultKey, "api_key "+keyA+" "+keyB, 1)
		loadCaddyfile(t, cfg)
		t.Cleanup(func() { unloadCaddy(t) })
		var ids []string
		for _, key := range []string{keyA, keyA, keyB, keyB} {
			ids = append(ids, createTaskWith(t, provider, key))
		}
		st := runningApp(t).store(time.Second)
		testkit.WaitFor(t, 2*testPollInterval+pollSlack, "every polled delivery", func() bool {
			for _, id := range ids {
				if rec, err := st.Get(t.Context(), store.Key{Provider: provider, ID: id}); err != nil || rec.State != store.StateDelivered {
					return false
				}
			}
			return true
		})
		for name, key := range map[string]string{"A": keyA, "B": keyB} {
			s := keyStats(t, sim.Sim, key)
			if s.GetTaskResultCalls == 0 || s.ForeignTaskCalls != 0 {
				t.Errorf("account %s: %d getTaskResult calls, %d for another account's task; want some, none", name, s.GetTaskResultCalls, s.ForeignTaskCalls)
			}
		}
	})
}

// createTaskWith submits a reCAPTCHA task with clientKey key as the
// official clients do (no callbackUrl) and returns its id as a string.
func createTaskWith(t *testing.T, provider, key string) string {
	t.Helper()
	resp := jsonCall(t, provider, "createTask",
		`{"clientKey":"`+key+`","task":{"type":"RecaptchaV2TaskProxyless","websiteURL":"https://a.example/","websiteKey":"6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-"}}`)
	var a struct {
		ErrorID int             `json:"errorId"`
		TaskID  json.RawMessage `json:"taskId"`
	}
	if resp.status != http.StatusOK || json.Unmarshal(resp.body, &a) != nil || a.ErrorID != 0 {
		t.Fatalf("createTask answered %d %q", resp.status, resp.body)
	}
	return strings.Trim(string(a.TaskID), `"`)
}

// TestKeyRotationLosesNothing follows docs' rotation through reloads of
// one Caddy: the old key alone; old and new side by side while the app
// switches; the old key removed too early, while its tasks are pending
// (they become unpollable: counted, shown, not polled, not lost); the old
// key back (pollable again); every task recovered with its own key; the
// old key removed once status shows none of its tasks left. No key is in
// the log, an admin answer or the store's files.
func TestKeyRotationLosesNothing(t *testing.T) {
	const oldKey, newKey = keyA, keyB
	sim := newPollerSim(t, captchasim.Config{Seed: 33, DropRate: 1, Key: oldKey, Keys: []string{newKey}, SolveMin: time.Hour, SolveMax: time.Hour})
	app := newAppStub(t)
	poll := pollBlock("after 1s", "interval 5s")
	route := func(keys string) []pollerRoute {
		return []pollerRoute{{provider: "2captcha", sim: sim, apiKey: keys}}
	}
	env := startPollerCaddy(t, poll, app, route(oldKey)...)
	reload := func(keys string) {
		t.Helper()
		loadCaddyfile(t, pollerCaddyfile(env.dir, env.logFile, poll, app, route(keys)))
	}
	oldID, newID := accountID("2captcha", oldKey), accountID("2captcha", newKey)
	unpollable := func() float64 {
		return testutil.ToFloat64(runningApp(t).metrics.unpollable.WithLabelValues("2captcha"))
	}

	ofOld := submitWith(t, "2captcha", oldKey, "userrecaptcha", 2)
	reload(oldKey + " " + newKey)
	ofNew := submitWith(t, "2captcha", newKey, "userrecaptcha", 2)
	checkAccount(t, ofOld, oldKey)
	checkAccount(t, ofNew, newKey)

	// Removed too early: the old key's pending tasks become unpollable.
	before := unpollable()
	reload(newKey)
	if d := unpollable() - before; d != 2 {
		t.Errorf("tasks_unpollable_total rose by %v when the old key was removed, want 2 (its pending tasks)", d)
	}
	s := adminStatus(t)
	if acc := s.Accounts["2captcha"][oldID]; acc.Pending != 2 || acc.Unpollable != 2 || acc.APIKeyEntry != "" {
		t.Errorf("status of the removed account: %+v, want 2 pending, 2 unpollable, no key entry", acc)
	}
	if acc := s.Accounts["2captcha"][newID]; acc.Pending != 2 || acc.Unpollable != 0 || acc.APIKeyEntry != "api_key #1" {
		t.Errorf("status of the new account: %+v, want 2 pending, pollable, api_key #1", acc)
	}
	if n := s.Tasks["2captcha"].Unpollable; n != 2 {
		t.Errorf("status tasks.2captcha.unpollable = %d, want 2", n)
	}
	oldCalls := keyStats(t, sim.Sim, oldKey).ResCalls
	for _, pt := range ofOld {
		sim.Solve(pt.id)
	}
	testkit.HoldsFor(t, testPollInterval+pollSlack, "no poll with the removed key", func() bool {
		return keyStats(t, sim.Sim, oldKey).ResCalls == oldCalls && !allReceived(app, ofOld[:1])
	})

	// The old key back, listed second: its tasks are polled again.
	reload(newKey + " " + oldKey)
	for _, pt := range ofNew {
		sim.Solve(pt.id)
	}
	all := append(append([]pollerTask{}, ofOld...), ofNew...)
	testkit.WaitFor(t, 2*testPollInterval+pollSlack, "every task recovered", func() bool { return allReceived(app, all) })
	got := receivedOnce(t, app, all)
	for _, pt := range all {
		checkPolled(t, got[pt.key()], pt, "/cb/2captcha", sim.code(t, pt.id))
	}
	for _, key := range []string{oldKey, newKey} {
		if s := keyStats(t, sim.Sim, key); s.ForeignTaskCalls != 0 {
			t.Errorf("%d polls asked for another account's task", s.ForeignTaskCalls)
		}
	}

	// Nothing left of the old key: removing it now counts nothing.
	testkit.WaitFor(t, 5*time.Second, "the old account's tasks done", func() bool {
		return adminStatus(t).Accounts["2captcha"][oldID].Pending == 0
	})
	before = unpollable()
	reload(newKey)
	if d := unpollable() - before; d != 0 {
		t.Errorf("removing a key with no pending task counted %v unpollable tasks", d)
	}

	// No key anywhere: the log, the admin answers, the store's files.
	_, status := adminDo(t, http.MethodGet, "/pingback/status", "")
	_, tasks := adminDo(t, http.MethodGet, "/pingback/tasks?limit=100", "")
	_, ofAccount := adminDo(t, http.MethodGet, "/pingback/tasks?account="+oldID, "")
	var page struct {
		Tasks []store.Task `json:"tasks"`
	}
	if err := json.Unmarshal(ofAccount, &page); err != nil || len(page.Tasks) != len(ofOld) {
		t.Errorf("GET /pingback/tasks?account=<old>: %d tasks (%v), want %d", len(page.Tasks), err, len(ofOld))
	}
	for _, tk := range page.Tasks {
		if tk.Account != oldID {
			t.Errorf("task %s listed for account %s has account %q", tk.ID, oldID, tk.Account)
		}
	}
	logs, err := os.ReadFile(env.logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{oldKey, newKey} {
		for what, text := range map[string][]byte{"the log": logs, "the status": status, "the task list": tasks} {
			if strings.Contains(string(text), key) {
				t.Errorf("%s holds an API key", what)
			}
		}
		if files := testfs.FilesContaining(t, env.dir, []byte(key)); len(files) != 0 {
			t.Errorf("the store's files hold an API key: %v", files)
		}
	}
}

// TestUnknownKeyTask: a task submitted with a key this Caddy does not have
// is tracked and its pingback received, deduplicated and delivered as any
// other; it is never polled (not with another key either), counted once,
// warned about once per account and hour, shown in the status, and, its
// pingback lost, expires at give_up.
func TestUnknownKeyTask(t *testing.T) {
	delivered := newPollerSim(t, captchasim.Config{Seed: 34, Key: keyA, Keys: []string{keyForeign}, SolveMax: 300 * time.Millisecond})
	lost := newPollerSim(t, captchasim.Config{Seed: 35, DropRate: 1, Key: keyA, Keys: []string{keyForeign}, SolveMax: 300 * time.Millisecond})
	app := newAppStub(t)
	before := map[string]float64{}
	for _, p := range []string{"2captcha", "rucaptcha"} {
		m, _ := registerMetrics(nil)
		before[p] = testutil.ToFloat64(m.unpollable.WithLabelValues(p))
	}
	env := startPollerCaddy(t, pollBlock("after 1s", "interval 5s", "give_up 8s"), app,
		pollerRoute{provider: "2captcha", sim: delivered, apiKey: keyA},
		pollerRoute{provider: "rucaptcha", sim: lost, apiKey: keyA},
	)
	foreign := submitWith(t, "2captcha", keyForeign, "userrecaptcha", 2)
	gone := submitWith(t, "rucaptcha", keyForeign, "userrecaptcha", 1)
	checkAccount(t, foreign, keyForeign)
	checkAccount(t, gone, keyForeign)

	testkit.WaitFor(t, 10*time.Second, "the pingbacks delivered", func() bool { return allReceived(app, foreign) })
	receivedOnce(t, app, foreign)
	m := runningApp(t).metrics
	for p, want := range map[string]float64{"2captcha": 2, "rucaptcha": 1} {
		if d := testutil.ToFloat64(m.unpollable.WithLabelValues(p)) - before[p]; d != want {
			t.Errorf("tasks_unpollable_total{provider=%q} rose by %v, want %v", p, d, want)
		}
	}
	if acc := adminStatus(t).Accounts["rucaptcha"][accountID("rucaptcha", keyForeign)]; acc.Unpollable != 1 || acc.APIKeyEntry != "" {
		t.Errorf("status of the unknown account: %+v, want 1 unpollable, no key entry", acc)
	}
	task := getTask(t, gone[0])
	testkit.WaitFor(t, 8*time.Second+2*testPollInterval+pollSlack, "the lost task to expire at give_up", func() bool {
		task = getTask(t, gone[0])
		return task.State == store.TaskExpired
	})
	if !strings.Contains(task.LastError, "api_key") || task.Polls != 0 {
		t.Errorf("expired task: last_error %q, %d polls; want the reason naming api_key, never polled", task.LastError, task.Polls)
	}
	for _, sim := range []*pollerSim{delivered, lost} {
		if n := len(sim.resCalls()); n != 0 {
			t.Errorf("the provider got %d res.php requests, want none (no task of a known key is pending)", n)
		}
	}
	warned := logEntries(t, env.logFile, "tasks submitted with an API key this Caddy does not know: their results can only arrive by pingback; add the key to the provider's api_key")
	per := map[string]int{}
	for _, e := range warned {
		if e["level"] != "warn" {
			t.Errorf("unpollable warning at level %v", e["level"])
		}
		per[fmt.Sprint(e["provider"], " ", e["account"])]++
	}
	for _, p := range []string{"2captcha", "rucaptcha"} {
		if n := per[p+" "+accountID(p, keyForeign)]; n != 1 {
			t.Errorf("%s: the unpollable warning logged %d times for the account, want once (%v)", p, n, warned)
		}
	}
}

// TestOneAccountHeldBackOtherPollsOn: an account banned by the provider,
// or out of its res.php allowance, holds back only its own polls; the
// other account's tasks are recovered on time.
func TestOneAccountHeldBackOtherPollsOn(t *testing.T) {
	for _, tc := range []struct {
		name     string
		holdBack func(t *testing.T, sim *pollerSim)
	}{
		{"banned", func(t *testing.T, sim *pollerSim) {
			if err := sim.BanKey(keyA); err != nil {
				t.Fatal(err)
			}
		}},
		{"out of allowance", func(t *testing.T, _ *pollerSim) {
			as := runningApp(t).handle.account(store.Account{Provider: "2captcha", ID: accountID("2captcha", keyA)})
			as.mu.Lock()
			as.polls = 10*as.tracked + pollAllowance
			as.mu.Unlock()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim := newPollerSim(t, captchasim.Config{Seed: 36, DropRate: 1, Key: keyA, Keys: []string{keyB}, SolveMax: 300 * time.Millisecond})
			app := newAppStub(t)
			env := startPollerCaddy(t, pollBlock("after 1s", "interval 5s"), app,
				pollerRoute{provider: "2captcha", sim: sim, apiKey: keyA + " " + keyB})
			ofA := submitWith(t, "2captcha", keyA, "userrecaptcha", 2)
			ofB := submitWith(t, "2captcha", keyB, "userrecaptcha", 2)
			tc.holdBack(t, sim)
			start := time.Now()
			testkit.WaitFor(t, 1*time.Second+testPollInterval+pollSlack, "account B's results", func() bool { return allReceived(app, ofB) })
			t.Logf("account B recovered %s after A was held back", time.Since(start).Round(time.Millisecond))
			if allReceived(app, ofA[:1]) {
				t.Errorf("account A's result was recovered while it was held back")
			}
			for _, pt := range ofA {
				if task := getTask(t, pt); task.State != store.TaskPending {
					t.Errorf("%s is %s, want pending (kept for when the account may poll again)", pt.key(), task.State)
				}
			}
			if s := keyStats(t, sim.Sim, keyB); s.ResCalls == 0 || s.FaultAnswers != 0 {
				t.Errorf("account B: %d res.php requests, %d refused; want some, none", s.ResCalls, s.FaultAnswers)
			}
			if tc.name == "banned" {
				backoff := logEntries(t, env.logFile, "provider unavailable for polling with this account; backing off")
				for _, e := range backoff {
					if e["account"] != accountID("2captcha", keyA) {
						t.Errorf("back-off logged for account %v, want only A", e["account"])
					}
				}
				if len(backoff) == 0 {
					t.Error("no back-off for the banned account")
				}
			} else if s := keyStats(t, sim.Sim, keyA); s.ResCalls != 0 {
				t.Errorf("account A, out of allowance, made %d res.php requests, want none", s.ResCalls)
			}
		})
	}
}

// TestLocalAnswersOnlyToOwnKey: the track route answers res.php itself
// only for a request carrying the key of the task's own account; another
// configured key, or one this Caddy does not have, is passed through to
// the provider, which refuses another account's task.
func TestLocalAnswersOnlyToOwnKey(t *testing.T) {
	sim := newPollerSim(t, captchasim.Config{Seed: 37, Key: keyA, Keys: []string{keyB, keyForeign}, SolveMax: 200 * time.Millisecond})
	app := newAppStub(t)
	startPollerCaddy(t, pollBlock("after 30s"), app, pollerRoute{provider: "2captcha", sim: sim, apiKey: keyA + " " + keyB})
	tasks := submitWith(t, "2captcha", keyA, "userrecaptcha", 1)
	testkit.WaitFor(t, 10*time.Second, "the pingback delivered", func() bool { return allReceived(app, tasks) })
	id := tasks[0].id
	ask := func(key string) (string, bool) {
		t.Helper()
		n := sim.callsFor(id)
		resp, err := http.Get(testBase + "/api/2captcha/res.php?" + url.Values{"key": {key}, "action": {"get"}, "id": {id}}.Encode())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), sim.callsFor(id) > n
	}
	for _, tc := range []struct {
		name      string
		key       string
		wantLocal bool
		wantBody  string
	}{
		{"the task's own key", keyA, true, "OK|"},
		{"the other configured key", keyB, false, captchasim.CodeWrongCaptchaID},
		{"a key this Caddy does not have", keyForeign, false, captchasim.CodeWrongCaptchaID},
	} {
		body, passed := ask(tc.key)
		if passed == tc.wantLocal || !strings.HasPrefix(body, tc.wantBody) {
			t.Errorf("%s: answered %q, passed to the provider %v; want %q, local %v", tc.name, body, passed, tc.wantBody, tc.wantLocal)
		}
	}
}

// TestInstancesPollOnlyTheirAccounts: two instances on one PostgreSQL
// database, each with the key of one account of the provider. Tasks of
// both accounts, submitted through the first instance, pingbacks dropped:
// each instance polls only the tasks of the account it has the key for,
// with that key, and every result reaches the app once.
func TestInstancesPollOnlyTheirAccounts(t *testing.T) {
	dsn := pgtest.DSN(t)
	app := newAppStub(t)
	sim := newPollerSim(t, captchasim.Config{Seed: 38, DropRate: 1, Key: keyA, Keys: []string{keyB}, SolveMin: 200 * time.Millisecond, SolveMax: time.Second})
	cl := &pgCluster{dsn: dsn, schema: pgtest.Schema(t, dsn)}
	cl.globalFor = func(in *pgInstance) string {
		key := keyA
		if in.name == "B" {
			key = keyB
		}
		return fmt.Sprintf("provider 2captcha {\n\t\t\tendpoint %s\n\t\t\tapi_key %s\n\t\t}\n\t\tpoll {\n\t\t\tafter 1s\n\t\t\tinterval 5s\n\t\t}", sim.url, key)
	}
	cl.site = pgPollSite(app, sim)
	ins := cl.start(t, 2)
	a := ins[0]
	client := &http.Client{Timeout: 10 * time.Second}
	byKey := map[string][]string{}
	for _, key := range []string{keyA, keyA, keyA, keyB, keyB, keyB} {
		id, err := pollerSubmit(client, a.base()+"/api", key, "userrecaptcha", true, url.Values{"googlekey": {"k"}, "pageurl": {"https://a.example"}})
		if err != nil {
			t.Fatalf("submitting through A: %v", err)
		}
		byKey[key] = append(byKey[key], id)
	}
	testkit.WaitFor(t, 2*testPollInterval+pollSlack+10*time.Second, "every polled result delivered", func() bool {
		for _, ids := range byKey {
			for _, id := range ids {
				if app.Deliveries("2captcha:"+id) == 0 {
					return false
				}
			}
		}
		return true
	})
	name := map[string]string{keyA: "A", keyB: "B"}
	for key, ids := range byKey {
		for _, id := range ids {
			if n := app.Count("2captcha:" + id); n != 1 {
				t.Errorf("2captcha:%s reached the app %d times, want once", id, n)
			}
		}
		if s := keyStats(t, sim.Sim, key); s.ResCalls == 0 || s.ForeignTaskCalls != 0 {
			t.Errorf("account %s: %d res.php requests, %d for another account's task; want some, none", name[key], s.ResCalls, s.ForeignTaskCalls)
		}
	}
	// Each key is only in one instance's config, so every res.php
	// request with it (ResCalls above) came from that instance. Polled
	// results are delivered by whichever instance claims them (the one
	// delivery path).
	for _, r := range app.Requests() {
		if src := r.Header.Get(HeaderSource); src != "poll" {
			t.Errorf("%s reached the app with source %q, want poll (every pingback dropped)", r.Header.Get(HeaderIdempotencyKey), src)
		}
	}
}

// TestUntrackedConflictAsksEachKey: a conflict on a result whose task is
// not tracked is settled by asking the provider with each configured key
// in turn: the first account does not know the task (ERROR_WRONG_CAPTCHA_ID)
// or cannot ask (the provider fails), the second gives its result, which
// is delivered as the correction.
func TestUntrackedConflictAsksEachKey(t *testing.T) {
	const other = "c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4c4"
	for _, tc := range []struct {
		name  string
		first func(w http.ResponseWriter)
	}{
		{"first account does not know the task", func(w http.ResponseWriter) {
			_, _ = io.WriteString(w, `{"status":0,"request":"ERROR_WRONG_CAPTCHA_ID"}`)
		}},
		{"first account's request fails", func(w http.ResponseWriter) {
			http.Error(w, "upstream down", http.StatusServiceUnavailable)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := newAppStub(t)
			p := newTrkProvider(t)
			var mu sync.Mutex
			var asked []string
			orig := p.Server.Config.Handler
			p.Server.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !strings.HasSuffix(r.URL.Path, "res.php") {
					orig.ServeHTTP(w, r)
					return
				}
				key := r.FormValue("key")
				mu.Lock()
				asked = append(asked, key)
				mu.Unlock()
				if key == trkKey {
					_, _ = io.WriteString(w, `{"status":1,"request":"REAL"}`)
					return
				}
				tc.first(w)
			})
			global := strings.Replace(vfyGlobal(p), "api_key "+trkKey, "api_key "+other+" "+trkKey, 1)
			startCaddy(t, global, vfySite("unknown_ids accept", "pingback_url "+trkCallbackURL, p.URL, app))
			id := "72000000002"
			vfyPingback(t, "/cb", id, "FORGED")
			waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
			vfyPingback(t, "/cb", id, "REAL")
			key := "2captcha:" + id + ":correction"
			testkit.WaitFor(t, 10*time.Second, "the correction", func() bool { return len(app.WithKey(key)) > 0 })
			wantDelivery(t, app, key, "REAL", "/cb", "res_php", "false", "correction")
			mu.Lock()
			defer mu.Unlock()
			if len(asked) != 2 || asked[0] != other || asked[1] != trkKey {
				t.Errorf("the provider was asked with %d keys (first the other account's: %v), want the two in api_key order", len(asked), len(asked) > 0 && asked[0] == other)
			}
		})
	}
}

// TestVerifyResPHPUnknownKeyNoToken: with verify res_php, a pingback for a
// task without a token whose account's key this Caddy does not have cannot
// be verified (the provider cannot be asked): it is quarantined as
// unverified, never delivered unverified, and the provider is not asked.
func TestVerifyResPHPUnknownKeyNoToken(t *testing.T) {
	app, p := startVfy(t, "verify res_php", nil)
	st := runningApp(t).store(time.Second)
	now := time.Now().UTC()
	id := "72000000004"
	if _, err := st.AddTask(t.Context(), &store.Task{Provider: "2captcha", ID: id, Account: accountID("2captcha", keyForeign),
		SubmittedAt: now, PingbackURL: trkCallbackURL, State: store.TaskPending, NextPollAt: now.Add(time.Hour),
		UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	vfyPingback(t, "/cb", id, "CODE")
	rec := waitForState(t, 5*time.Second, "2captcha", id, store.StateQuarantined)
	if rec.Quarantine != whyUnverified {
		t.Errorf("quarantined as %q, want %q", rec.Quarantine, whyUnverified)
	}
	if n := len(p.requests("res.php")); n != 0 {
		t.Errorf("the provider was asked %d times, want never (not this Caddy's key)", n)
	}
	if n := len(app.Requests()); n != 0 {
		t.Errorf("the app got %d requests, want none", n)
	}
}

// TestTaskWithoutAccountPolledWithFirstKey: a task stored without account
// (tracked before accounts, while its provider had no key, so the store's
// upgrade could not stamp it) is polled with the provider's first key.
func TestTaskWithoutAccountPolledWithFirstKey(t *testing.T) {
	sim := newPollerSim(t, captchasim.Config{Seed: 39, DropRate: 1, Key: keyA, Keys: []string{keyB}, SolveMax: 200 * time.Millisecond})
	app := newAppStub(t)
	startPollerCaddy(t, pollBlock("after 1s", "interval 5s"), app, pollerRoute{provider: "2captcha", sim: sim, apiKey: keyA + " " + keyB})
	tasks := submitWith(t, "2captcha", keyA, "userrecaptcha", 1)
	st := runningApp(t).store(time.Second)
	// As the task would be had it been stored before accounts: no account.
	if _, err := st.UpdateTask(t.Context(), store.Key{Provider: "2captcha", ID: tasks[0].id}, func(tk *store.Task) error {
		tk.Account = ""
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 2*testPollInterval+pollSlack, "the result recovered", func() bool { return allReceived(app, tasks) })
	got := receivedOnce(t, app, tasks)
	checkPolled(t, got[tasks[0].key()], tasks[0], "/cb/2captcha", sim.code(t, tasks[0].id))
	if s := keyStats(t, sim.Sim, keyA); s.ResCalls == 0 || s.ForeignTaskCalls != 0 {
		t.Errorf("first key: %d res.php requests, %d for another account's task; want some, none", s.ResCalls, s.ForeignTaskCalls)
	}
	if s := keyStats(t, sim.Sim, keyB); s.ResCalls != 0 {
		t.Errorf("second key: %d res.php requests, want none", s.ResCalls)
	}
}

// TestUntrackedLocalAnswerNeedsOneKey: the track route answers res.php
// itself for a result with no tracked task only when the provider has one
// key (as before accounts); with several, whose result it is is unknown,
// so the request goes to the provider.
func TestUntrackedLocalAnswerNeedsOneKey(t *testing.T) {
	const other = "c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5"
	for _, tc := range []struct {
		name      string
		keys      string
		wantLocal bool
	}{
		{"one key", trkKey, true},
		{"two keys", other + " " + trkKey, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := newAppStub(t)
			p := newTrkProvider(t)
			global := strings.Replace(vfyGlobal(p), "api_key "+trkKey, "api_key "+tc.keys, 1)
			startCaddy(t, global, vfySite("unknown_ids accept", "pingback_url "+trkCallbackURL, p.URL, app))
			id := "72000000003"
			vfyPingback(t, "/cb", id, "UNTRACKED-CODE")
			waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
			before := len(p.requests("res.php"))
			resp := trkDo(t, http.MethodGet, "/res.php?"+url.Values{"key": {trkKey}, "action": {"get"}, "id": {id}}.Encode(), "", nil)
			passed := len(p.requests("res.php")) > before
			if passed == tc.wantLocal {
				t.Errorf("answered %d %q, passed to the provider %v; want local %v", resp.status, resp.body, passed, tc.wantLocal)
			}
			if tc.wantLocal && string(resp.body) != "OK|UNTRACKED-CODE" {
				t.Errorf("local answer %q, want OK|UNTRACKED-CODE", resp.body)
			}
		})
	}
}
