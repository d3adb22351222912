package pingback

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// The poller tests run a real in-process Caddy (Badger on disk) and the
// provider simulator on loopback servers. One config serves every provider
// of a test: a pingback route /cb/<provider> in front of the app stand-in
// and a pingback_track route /api/<provider>/ in front of that provider's
// simulator, through which the tests submit tasks the way an app does. Each
// provider has its own simulator and its own poller state (limiter,
// backoff, key stop), so one test runs up to three scenarios at once and
// the waits on poll intervals overlap.

// The poll timing of these tests: the first poll is due 1s after
// submission, then every 5s (the smallest interval allowed).
const (
	testPollAfter    = time.Second
	testPollInterval = 5 * time.Second
	// pollSlack is the margin on top of after+interval for a result to
	// reach the app: the poll loop's 1s tick, the request, the delivery.
	pollSlack = 5 * time.Second
)

// pollerImage is the "captcha image" of method=post submissions.
var pollerImage = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR poller test captcha")

// pollerSim is a captchasim.Sim on a loopback server that also records
// every res.php request it receives and can be switched into an outage
// (res.php answered by another handler) or made slow.
type pollerSim struct {
	*captchasim.Sim
	url      string // base URL of in.php and res.php
	hostPort string // for reverse_proxy

	mu    sync.Mutex
	calls []resCall
	fault http.Handler  // while set, it answers res.php (an outage)
	delay time.Duration // each res.php answer waits this long (a slow provider)
}

// resCall is one res.php request the simulator received.
type resCall struct {
	at    time.Time
	ids   []string // the task ids asked
	bulk  bool     // asked with ids= (else id=)
	fault bool     // answered by the fault handler
	// method is the request's method; keyInURL: a key parameter was in
	// its query (the poller sends POST bodies where the provider takes them).
	method   string
	keyInURL bool
}

// newPollerSim starts a simulator on a loopback server; it is closed at
// test end (after the Caddy config registered later is unloaded).
func newPollerSim(t *testing.T, cfg captchasim.Config) *pollerSim {
	t.Helper()
	sim, err := captchasim.New(cfg)
	if err != nil {
		t.Fatalf("captchasim.New: %v", err)
	}
	s := &pollerSim{Sim: sim}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = sim.Close() })
	s.url = srv.URL
	s.hostPort = strings.TrimPrefix(srv.URL, "http://")
	return s
}

func (s *pollerSim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if path.Base(r.URL.Path) != "res.php" {
		s.Sim.ServeHTTP(w, r)
		return
	}
	q := r.URL.Query()
	c := resCall{at: time.Now(), method: r.Method, keyInURL: q.Has("key")}
	if r.Method == http.MethodPost {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		for k, v := range parseURLEncoded(string(body)) {
			q[k] = v
		}
	}
	if ids := q.Get("ids"); ids != "" {
		c.ids, c.bulk = strings.Split(ids, ","), true
	} else if id := q.Get("id"); id != "" {
		c.ids = []string{id}
	}
	s.mu.Lock()
	fault, delay := s.fault, s.delay
	c.fault = fault != nil
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay) // a slow provider, not synchronisation
	}
	if fault != nil {
		fault.ServeHTTP(w, r)
		return
	}
	s.Sim.ServeHTTP(w, r)
}

// setFault makes h answer res.php from now on; nil ends the outage.
func (s *pollerSim) setFault(h http.Handler) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fault = h
}

// setDelay makes every res.php answer wait d.
func (s *pollerSim) setDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// resCalls returns the res.php requests received so far.
func (s *pollerSim) resCalls() []resCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// callsFor counts the res.php requests that asked for task id.
func (s *pollerSim) callsFor(id string) int {
	n := 0
	for _, c := range s.resCalls() {
		if slices.Contains(c.ids, id) {
			n++
		}
	}
	return n
}

// faultCalls returns the res.php requests answered during an outage.
func (s *pollerSim) faultCalls() []resCall {
	var out []resCall
	for _, c := range s.resCalls() {
		if c.fault {
			out = append(out, c)
		}
	}
	return out
}

// code returns what task id ends with, as the simulator decided.
func (s *pollerSim) code(t *testing.T, id string) string {
	t.Helper()
	info, ok := s.Task(id)
	if !ok {
		t.Fatalf("simulator does not know task %s", id)
	}
	return info.Code
}

// pollerRoute is one provider of a poller test config.
type pollerRoute struct {
	provider string
	sim      *pollerSim
	apiKey   string // Caddy's api_key for the provider; default the simulator's
}

// pollerEnv is a running poller test config.
type pollerEnv struct {
	app     *testkit.App
	dir     string // storage_dir
	logFile string // Caddy's log, JSON lines
	sims    map[string]*pollerSim
}

// pollerCaddyfile builds the config of a poller test: the global pingback
// block (storage_dir, a provider block per route, then the extra lines,
// normally the poll block) and one site with the routes of each provider.
func pollerCaddyfile(dir, logFile, extra string, app *testkit.App, routes []pollerRoute) string {
	var providers, handles strings.Builder
	for _, r := range routes {
		key := r.apiKey
		if key == "" {
			key = captchasim.DefaultKey
		}
		fmt.Fprintf(&providers, "\t\tprovider %s {\n\t\t\tendpoint %s\n\t\t\tapi_key %s\n\t\t}\n", r.provider, r.sim.url, key)
		fmt.Fprintf(&handles, `	handle /cb/%[1]s {
		pingback {
			provider %[1]s
		}
		reverse_proxy %[2]s
	}
	handle /api/%[1]s/* {
		pingback_track {
			provider %[1]s
			pingback_url %[3]s/cb/%[1]s
		}
		reverse_proxy %[4]s
	}
`, r.provider, app.HostPort(), testBase, r.sim.hostPort)
	}
	g := testGlobals("storage_dir " + dir + "\n" + providers.String() + extra)
	g.LogFile = logFile
	return g.Caddyfile(fmt.Sprintf("http://localhost:%s {\n%s\trespond 404\n}\n", testHTTPPort, handles.String()))
}

// startPollerCaddy loads a poller test config in-process; an empty config
// is loaded at test end, before the storage directory is removed.
func startPollerCaddy(t *testing.T, extra string, app *testkit.App, routes ...pollerRoute) *pollerEnv {
	t.Helper()
	env := &pollerEnv{
		app:     app,
		dir:     t.TempDir(),
		logFile: filepath.Join(t.TempDir(), "caddy.log"),
		sims:    map[string]*pollerSim{},
	}
	for _, r := range routes {
		env.sims[r.provider] = r.sim
	}
	loadCaddyfile(t, pollerCaddyfile(env.dir, env.logFile, extra, app, routes))
	t.Cleanup(func() {
		unloadCaddy(t)
		if t.Failed() {
			testkit.LogTail(t, env.logFile, 80)
		}
	})
	return env
}

// pollBlock is the poll block of the global pingback option.
func pollBlock(lines ...string) string {
	return "poll {\n\t\t\t" + strings.Join(lines, "\n\t\t\t") + "\n\t\t}"
}

// pollerTask is a submitted task.
type pollerTask struct {
	provider, method, id string
}

func (pt pollerTask) key() string { return pt.provider + ":" + pt.id }

// taskSpec asks for n tasks of method submitted to provider's track route.
type taskSpec struct {
	provider, method string
	n                int
	json             bool // ask in.php for a JSON answer
}

// submitTasks submits every task of specs concurrently through Caddy's
// pingback_track routes, as an app pointed at Caddy instead of the
// provider does, so that they all fall due together.
func submitTasks(t *testing.T, specs ...taskSpec) []pollerTask {
	t.Helper()
	return submitThroughCaddy(t, true, specs)
}

// submitTasksInOrder is submitTasks one task after the other, in the order
// of specs: a simulator then draws the same faults for the same tasks on
// every run.
func submitTasksInOrder(t *testing.T, specs ...taskSpec) []pollerTask {
	t.Helper()
	return submitThroughCaddy(t, false, specs)
}

func submitThroughCaddy(t *testing.T, concurrent bool, specs []taskSpec) []pollerTask {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		tasks []pollerTask
		errs  []error
	)
	for _, sp := range specs {
		for range sp.n {
			submit := func() {
				id, err := pollerSubmit(client, testBase+"/api/"+sp.provider, captchasim.DefaultKey, sp.method, sp.json, nil)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %w", sp.provider, sp.method, err))
					return
				}
				tasks = append(tasks, pollerTask{provider: sp.provider, method: sp.method, id: id})
			}
			if concurrent {
				wg.Go(submit)
			} else {
				submit()
			}
		}
	}
	wg.Wait()
	for _, err := range errs {
		t.Errorf("submit: %v", err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	return tasks
}

// pollerSubmit submits one task to in.php at base: token methods by GET
// with a query, method=post as a multipart image upload. json asks for a
// JSON answer. It returns the task id from `OK|<id>` or
// {"status":1,"request":<id>} (a string or a number).
func pollerSubmit(client *http.Client, base, key, method string, asJSON bool, extra url.Values) (string, error) {
	vals := url.Values{"key": {key}, "method": {method}}
	if asJSON {
		vals.Set("json", "1")
	}
	for k, v := range extra {
		vals[k] = v
	}
	var req *http.Request
	var err error
	if method == "post" {
		var fields []string
		for k := range vals {
			fields = append(fields, k, vals.Get(k))
		}
		ctype, body, err := testkit.EncodeMultipart(pollerImage, fields...)
		if err != nil {
			return "", err
		}
		if req, err = http.NewRequest(http.MethodPost, base+"/in.php", bytes.NewReader(body)); err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", ctype)
	} else {
		vals.Set("googlekey", "6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-")
		vals.Set("pageurl", "https://example.com/login")
		if req, err = http.NewRequest(http.MethodGet, base+"/in.php?"+vals.Encode(), nil); err != nil {
			return "", err
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	body := strings.TrimSpace(string(b))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("in.php answered %d %q", resp.StatusCode, body)
	}
	if id, ok := strings.CutPrefix(body, "OK|"); ok {
		return id, nil
	}
	var ans struct {
		Status  int `json:"status"`
		Request any `json:"request"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&ans); err != nil || ans.Status != 1 {
		return "", fmt.Errorf("in.php answered %q", body)
	}
	switch id := ans.Request.(type) {
	case string:
		return id, nil
	case json.Number:
		return id.String(), nil
	}
	return "", fmt.Errorf("in.php answered %q: no task id", body)
}

// byKey groups what the app received by idempotency key.
func byKey(app *testkit.App) map[string][]testkit.Received {
	out := map[string][]testkit.Received{}
	for _, r := range app.Requests() {
		k := r.Header.Get(HeaderIdempotencyKey)
		out[k] = append(out[k], r)
	}
	return out
}

// allReceived reports whether the app received every task's result.
func allReceived(app *testkit.App, tasks []pollerTask) bool {
	got := byKey(app)
	for _, pt := range tasks {
		if len(got[pt.key()]) == 0 {
			return false
		}
	}
	return true
}

// waitSettled waits until the record of every task is delivered, so no
// forward of them is in flight any more.
func waitSettled(t *testing.T, tasks []pollerTask) {
	t.Helper()
	st := runningApp(t).store(time.Second)
	testkit.WaitFor(t, 10*time.Second, "every result to be recorded as delivered", func() bool {
		for _, pt := range tasks {
			rec, err := st.Get(context.Background(), store.Key{Provider: pt.provider, ID: pt.id})
			if err != nil || rec.State != store.StateDelivered {
				return false
			}
		}
		return true
	})
}

// receivedOnce checks that the app received each task's result exactly
// once, and returns those requests by key.
func receivedOnce(t *testing.T, app *testkit.App, tasks []pollerTask) map[string]testkit.Received {
	t.Helper()
	got := byKey(app)
	out := map[string]testkit.Received{}
	for _, pt := range tasks {
		if n := len(got[pt.key()]); n != 1 {
			t.Errorf("app received %s (%s) %d times, want exactly once", pt.key(), pt.method, n)
			continue
		}
		out[pt.key()] = got[pt.key()][0]
	}
	return out
}

// pingbackFields returns the id and code of a pingback request: the query
// of a GET, the form body of a POST.
func pingbackFields(t *testing.T, r testkit.Received) (id, code string) {
	t.Helper()
	u, err := url.ParseRequestURI(r.URI)
	if err != nil {
		t.Fatalf("request URI %q: %v", r.URI, err)
	}
	vals := u.Query()
	if r.Method == http.MethodPost {
		if ct := r.Header.Get("Content-Type"); ct != "application/x-www-form-urlencoded" {
			t.Errorf("POST pingback with Content-Type %q, want a form", ct)
		}
		if vals, err = url.ParseQuery(r.Body); err != nil {
			t.Fatalf("form body %q: %v", r.Body, err)
		}
	}
	return vals.Get("id"), vals.Get("code")
}

// checkPolled checks that r is the pingback the provider would have sent
// for pt, with code, delivered by the poller: the provider's method and
// fields on the task's pingback URL (path cbPath), marked
// X-Pingback-Source: poll.
func checkPolled(t *testing.T, r testkit.Received, pt pollerTask, cbPath, code string) {
	t.Helper()
	wantMethod := http.MethodPost
	if pt.provider == "captchaai" {
		wantMethod = http.MethodGet
	}
	u, _ := url.ParseRequestURI(r.URI)
	if r.Method != wantMethod || u == nil || u.Path != cbPath {
		t.Errorf("%s: delivered as %s %s, want %s %s", pt.key(), r.Method, r.URI, wantMethod, cbPath)
	}
	if wantMethod == http.MethodGet && r.Body != "" {
		t.Errorf("%s: GET pingback with a body %q", pt.key(), r.Body)
	}
	if src := r.Header.Get(HeaderSource); src != "poll" {
		t.Errorf("%s: %s %q, want poll", pt.key(), HeaderSource, src)
	}
	if a := r.Header.Get(HeaderAttempt); a != "1" {
		t.Errorf("%s: %s %q, want 1", pt.key(), HeaderAttempt, a)
	}
	id, got := pingbackFields(t, r)
	if id != pt.id || got != code {
		t.Errorf("%s: delivered id %q code %.20q, want id %q code %.20q", pt.key(), id, got, pt.id, code)
	}
}

// tasksOf returns the tasks of provider (and method, if not empty).
func tasksOf(tasks []pollerTask, provider, method string) []pollerTask {
	var out []pollerTask
	for _, pt := range tasks {
		if pt.provider == provider && (method == "" || pt.method == method) {
			out = append(out, pt)
		}
	}
	return out
}

// getTask reads a task from the running config's store.
func getTask(t *testing.T, pt pollerTask) *store.Task {
	t.Helper()
	task, err := runningApp(t).store(time.Second).GetTask(context.Background(), store.Key{Provider: pt.provider, ID: pt.id})
	if err != nil {
		t.Fatalf("task %s: %v", pt.key(), err)
	}
	return task
}

// logEntries returns the JSON log entries of file whose message is msg.
func logEntries(t *testing.T, file, msg string) []map[string]any {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatalf("reading the log: %v", err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) == nil && e["msg"] == msg {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the log: %v", err)
	}
	return out
}

// TestPollerRecoversLostPingbacks: with every pingback dropped, every task
// still reaches the app exactly once, through the poller, within after +
// interval + slack, as the provider's own pingback (2captcha: POST form;
// captchaai: GET query) with its own correct result. Token tasks are
// polled in bulk (ids=), image tasks one by one; a bulk answer with the
// wrong element count is never guessed at; unsolvable tasks arrive as
// code=ERROR_CAPTCHA_UNSOLVABLE; res.php calls per task stay few.
func TestPollerRecoversLostPingbacks(t *testing.T) {
	// 2captcha: solved after the first poll (due at 1s, made by about 3s
	// at the latest: the 1s tick, then the rate limiter's next tick) and
	// before the second (5s later), so every task needs exactly two.
	twoCaptcha := newPollerSim(t, captchasim.Config{Seed: 1, DropRate: 1,
		SolveMin: 4 * time.Second, SolveMax: 5500 * time.Millisecond})
	// captchaai: GET pingbacks, numeric JSON ids, and bulk answers always one element short.
	captchaAI := newPollerSim(t, captchasim.Config{Seed: 2, DropRate: 1, PingbackMethod: "GET",
		NumericJSONIDs: true, BulkMismatchRate: 1, SolveMax: 500 * time.Millisecond})
	// rucaptcha: every task unsolvable.
	ruCaptcha := newPollerSim(t, captchasim.Config{Seed: 3, DropRate: 1, UnsolvableRate: 1, SolveMax: 500 * time.Millisecond})
	app := newAppStub(t)
	startPollerCaddy(t, pollBlock("after 1s", "interval 5s"), app,
		pollerRoute{provider: "2captcha", sim: twoCaptcha},
		pollerRoute{provider: "captchaai", sim: captchaAI},
		pollerRoute{provider: "rucaptcha", sim: ruCaptcha},
	)
	recoveredBefore := counterValue(t, theMetrics.tasks.WithLabelValues("2captcha", "recovered"))

	start := time.Now()
	tasks := submitTasks(t,
		taskSpec{provider: "2captcha", method: "userrecaptcha", n: 8},
		taskSpec{provider: "2captcha", method: "post", n: 4, json: true},
		taskSpec{provider: "captchaai", method: "userrecaptcha", n: 4, json: true},
		taskSpec{provider: "rucaptcha", method: "hcaptcha", n: 3},
		taskSpec{provider: "rucaptcha", method: "post", n: 2},
	)
	bound := testPollAfter + testPollInterval + pollSlack
	testkit.WaitFor(t, bound-time.Since(start), "every task to reach the app", func() bool { return allReceived(app, tasks) })
	t.Logf("all %d results reached the app %s after the first submission (bound %s)", len(tasks), time.Since(start).Round(time.Millisecond), bound)
	waitSettled(t, tasks)
	got := receivedOnce(t, app, tasks)
	if n := len(app.Requests()); n != len(tasks) {
		t.Errorf("app received %d requests for %d tasks", n, len(tasks))
	}

	for _, pt := range tasks {
		sim := map[string]*pollerSim{"2captcha": twoCaptcha, "captchaai": captchaAI, "rucaptcha": ruCaptcha}[pt.provider]
		code := sim.code(t, pt.id)
		if pt.provider == "rucaptcha" && code != captchasim.CodeUnsolvable {
			t.Fatalf("simulator made %s solvable", pt.key())
		}
		if r, ok := got[pt.key()]; ok {
			checkPolled(t, r, pt, "/cb/"+pt.provider, code)
		}
		if rec := getRecord(t, pt.provider, pt.id); rec.Source != "poll" || rec.Code != code {
			t.Errorf("%s stored with source %q, code ok %v; want poll and the provider's code", pt.key(), rec.Source, rec.Code == code)
		}
		// The plugin counts its res.php requests per task, like the provider.
		if task := getTask(t, pt); task.State != store.TaskDone || task.Polls != sim.callsFor(pt.id) {
			t.Errorf("%s: task %s with %d polls recorded, the provider saw %d; want done and equal", pt.key(), task.State, task.Polls, sim.callsFor(pt.id))
		}
	}
	if d := counterValue(t, theMetrics.tasks.WithLabelValues("2captcha", "recovered")) - recoveredBefore; int(d) != len(tasksOf(tasks, "2captcha", "")) {
		t.Errorf("2captcha recovered counter grew by %v, want %d", d, len(tasksOf(tasks, "2captcha", "")))
	}

	t.Run("res.php by POST where the provider takes it, the key in no URL", func(t *testing.T) {
		for _, sc := range []struct {
			name   string
			sim    *pollerSim
			method string
		}{{"2captcha", twoCaptcha, http.MethodPost}, {"captchaai", captchaAI, http.MethodGet}} {
			calls := sc.sim.resCalls()
			if len(calls) == 0 {
				t.Fatalf("%s: no res.php request", sc.name)
			}
			for _, c := range calls {
				if c.method != sc.method || (sc.method == http.MethodPost && c.keyInURL) {
					t.Errorf("%s: res.php asked by %s (key in the URL: %v), want %s", sc.name, c.method, c.keyInURL, sc.method)
				}
			}
		}
	})

	t.Run("bulk for tokens, one by one for images", func(t *testing.T) {
		tokens := map[string]bool{}
		for _, pt := range tasksOf(tasks, "2captcha", "userrecaptcha") {
			tokens[pt.id] = true
		}
		calls := twoCaptcha.resCalls()
		bulk, tokenRequests := 0, 0
		for _, c := range calls {
			if slices.ContainsFunc(c.ids, func(id string) bool { return tokens[id] }) {
				tokenRequests++
			}
			if !c.bulk {
				continue
			}
			bulk++
			if len(c.ids) < 2 {
				t.Errorf("bulk request for %d id(s): %v", len(c.ids), c.ids)
			}
			for _, id := range c.ids {
				if !tokens[id] {
					t.Errorf("task %s (not a token task) asked in bulk", id)
				}
			}
		}
		// Not ready, then the result: each task is asked twice. The 8
		// token tasks share their 16 polls in a few requests (2 unless
		// the submissions straddled a tick).
		for _, pt := range tasksOf(tasks, "2captcha", "") {
			if n := twoCaptcha.callsFor(pt.id); n != 2 {
				t.Errorf("%s (%s) was asked %d times, want 2", pt.key(), pt.method, n)
			}
		}
		if bulk == 0 || tokenRequests > 4 {
			t.Errorf("%d requests (%d bulk) for 8 token tasks asked twice each, want at most 4, in bulk", tokenRequests, bulk)
		}
		st := twoCaptcha.Stats()
		if st.BulkCalls != int64(bulk) || st.ResCallsByAction["get"] != int64(len(calls)) {
			t.Errorf("simulator counted %d bulk and %d get requests, the recorder %d and %d", st.BulkCalls, st.ResCallsByAction["get"], bulk, len(calls))
		}
		if st.ResCallsPerTaskMax > 3 {
			t.Errorf("a task was asked %d times, want at most 3", st.ResCallsPerTaskMax)
		}
	})

	t.Run("bulk count mismatch falls back to single gets", func(t *testing.T) {
		st := captchaAI.Stats()
		if st.BulkMismatches == 0 {
			t.Fatal("the simulator never answered a bulk request with the wrong count; the fallback was not exercised")
		}
		for _, pt := range tasksOf(tasks, "captchaai", "") {
			single := 0
			for _, c := range captchaAI.resCalls() {
				if !c.bulk && slices.Contains(c.ids, pt.id) {
					single++
				}
			}
			if single == 0 {
				t.Errorf("%s was never asked on its own after the bulk mismatch", pt.key())
			}
		}
		if st.ResCallsPerTaskMax > 3 {
			t.Errorf("a task was asked %d times, want at most 3", st.ResCallsPerTaskMax)
		}
	})

	t.Run("unsolvable", func(t *testing.T) {
		if st := ruCaptcha.Stats(); st.TasksUnsolvable != 5 || st.ResCallsPerTaskMax > 3 {
			t.Errorf("simulator: %d unsolvable tasks, at most %d calls per task; want 5 and at most 3", st.TasksUnsolvable, st.ResCallsPerTaskMax)
		}
	})
}

// TestPollerRacesPingbacksAndExpires: pingbacks dropped, duplicated and
// late race the poller, and every task still reaches the app exactly once.
// Meanwhile tasks the provider never solves are marked expired at give_up,
// and tasks the provider has forgotten (ERROR_WRONG_CAPTCHA_ID) at once;
// both are counted and never polled again.
func TestPollerRacesPingbacksAndExpires(t *testing.T) {
	// Solved before the first poll is due, with pingbacks that may be
	// dropped, sent twice, or sent 1.5s late: while the poller, slowed by
	// res.php answers that take 300ms, works through its first round.
	racing := newPollerSim(t, captchasim.Config{Seed: 11, DropRate: .3, DuplicateRate: .3, LateRate: .3,
		LateDelay: 1500 * time.Millisecond, SolveMin: 100 * time.Millisecond, SolveMax: 700 * time.Millisecond})
	racing.setDelay(300 * time.Millisecond)
	neverSolved := newPollerSim(t, captchasim.Config{Seed: 12, SolveMin: time.Hour, SolveMax: time.Hour})
	forgetful := newPollerSim(t, captchasim.Config{Seed: 13, SolveMin: time.Hour, SolveMax: time.Hour,
		ForgetAfter: 500 * time.Millisecond})
	app := newAppStub(t)
	const giveUp = 6 * time.Second
	sims := startPollerCaddy(t, pollBlock("after 1s", "interval 5s", "give_up 6s"), app,
		pollerRoute{provider: "2captcha", sim: racing},
		pollerRoute{provider: "captchaai", sim: neverSolved},
		pollerRoute{provider: "rucaptcha", sim: forgetful},
	).sims
	dupBefore := counterValue(t, theMetrics.callbacks.WithLabelValues("2captcha", "duplicate"))
	pollDupBefore := counterValue(t, theMetrics.callbacks.WithLabelValues("2captcha", "poll_duplicate"))
	expiredBefore := map[string]float64{}
	for _, p := range []string{"captchaai", "rucaptcha"} {
		expiredBefore[p] = counterValue(t, theMetrics.tasks.WithLabelValues(p, "expired"))
	}

	start := time.Now()
	tasks := submitTasksInOrder(t,
		taskSpec{provider: "2captcha", method: "userrecaptcha", n: 20},
		taskSpec{provider: "2captcha", method: "hcaptcha", n: 4, json: true},
		taskSpec{provider: "2captcha", method: "post", n: 6},
		taskSpec{provider: "captchaai", method: "userrecaptcha", n: 2},
		taskSpec{provider: "captchaai", method: "post", n: 2},
		taskSpec{provider: "rucaptcha", method: "userrecaptcha", n: 2},
		taskSpec{provider: "rucaptcha", method: "post", n: 1},
	)
	raced := tasksOf(tasks, "2captcha", "")

	t.Run("exactly once", func(t *testing.T) {
		// The faults the simulator drew for these tasks, and the pingback
		// calls that makes.
		var dropped, duplicated, late, wantSent int
		for _, pt := range raced {
			info, _ := racing.Task(pt.id)
			switch {
			case info.PingbackDrop:
				dropped++
			case info.PingbackDuplicate:
				wantSent += 2
			default:
				wantSent++
			}
			if info.PingbackDuplicate && !info.PingbackDrop {
				duplicated++
			}
			if info.PingbackLate && !info.PingbackDrop {
				late++
			}
		}
		t.Logf("%d tasks: %d pingbacks dropped, %d duplicated, %d late", len(raced), dropped, duplicated, late)
		if dropped == 0 || duplicated == 0 || late == 0 {
			t.Fatalf("the seed draws no race: %d dropped, %d duplicated, %d late", dropped, duplicated, late)
		}

		testkit.WaitFor(t, testPollAfter+testPollInterval+pollSlack-time.Since(start), "every task to reach the app",
			func() bool { return allReceived(app, raced) })
		// Settled: every pingback call made (and answered), every record delivered.
		testkit.WaitFor(t, 10*time.Second, "every pingback to be sent", func() bool { return racing.Stats().PingbacksSent == int64(wantSent) })
		waitSettled(t, raced)
		got := receivedOnce(t, app, raced)

		sources := map[string]int{}
		for _, pt := range raced {
			r, ok := got[pt.key()]
			if !ok {
				continue
			}
			src := r.Header.Get(HeaderSource)
			sources[src]++
			id, code := pingbackFields(t, r)
			if r.Method != http.MethodPost || id != pt.id || code != racing.code(t, pt.id) {
				t.Errorf("%s: delivered as %s with id %q, code ok %v", pt.key(), r.Method, id, code == racing.code(t, pt.id))
			}
			info, _ := racing.Task(pt.id)
			if info.PingbackDrop && src != "poll" {
				t.Errorf("%s: pingback dropped, but delivered with source %q", pt.key(), src)
			}
		}
		// How the race went (timing decides): pingbacks that found the
		// result already stored, and polls that did.
		t.Logf("delivered by source: %v; duplicate pingbacks %v, polled results already stored %v", sources,
			counterValue(t, theMetrics.callbacks.WithLabelValues("2captcha", "duplicate"))-dupBefore,
			counterValue(t, theMetrics.callbacks.WithLabelValues("2captcha", "poll_duplicate"))-pollDupBefore)
		if st := racing.Stats(); st.PingbacksFailed != 0 {
			t.Errorf("%d pingbacks were not acknowledged by Caddy", st.PingbacksFailed)
		}
	})

	t.Run("expired", func(t *testing.T) {
		stale := append(tasksOf(tasks, "captchaai", ""), tasksOf(tasks, "rucaptcha", "")...)
		testkit.WaitFor(t, giveUp+testPollInterval+pollSlack-time.Since(start), "the unsolved tasks to expire", func() bool {
			for _, pt := range stale {
				if getTask(t, pt).State != store.TaskExpired {
					return false
				}
			}
			return true
		})
		for _, pt := range stale {
			task := getTask(t, pt)
			want := "no result within give_up"
			if pt.provider == "rucaptcha" {
				want = "provider does not know the task: " + captchasim.CodeWrongCaptchaID
			}
			if task.LastError != want || !task.NextPollAt.IsZero() {
				t.Errorf("%s expired with reason %q, next poll %v; want %q and none", pt.key(), task.LastError, task.NextPollAt, want)
			}
			if n := sims[pt.provider].callsFor(pt.id); n != 1 {
				t.Errorf("%s was asked %d times before it expired, want once", pt.key(), n)
			}
		}
		for p, before := range expiredBefore {
			if d := counterValue(t, theMetrics.tasks.WithLabelValues(p, "expired")) - before; int(d) != len(tasksOf(tasks, p, "")) {
				t.Errorf("%s expired counter grew by %v, want %d", p, d, len(tasksOf(tasks, p, "")))
			}
		}
		// Never polled again: no request for more than an interval.
		calls := len(neverSolved.resCalls()) + len(forgetful.resCalls())
		testkit.HoldsFor(t, testPollInterval+2*time.Second, "no res.php request after expiry", func() bool {
			return len(neverSolved.resCalls())+len(forgetful.resCalls()) == calls
		})
		for _, pt := range stale {
			if n := len(byKey(app)[pt.key()]); n != 0 {
				t.Errorf("app received %d results for the expired task %s", n, pt.key())
			}
		}
	})
}

// TestPollerProviderFailures: during a provider outage (HTML 5xx pages) and
// while it answers ERROR_NO_SLOT_AVAILABLE, the poller backs off: requests
// stay at least the 5s floor apart, no burst; after recovery every task is
// delivered once. A provider that rejects the API key is not asked again,
// and the log says so once, at error level, without the key.
func TestPollerProviderFailures(t *testing.T) {
	down := newPollerSim(t, captchasim.Config{Seed: 21, DropRate: 1})
	busy := newPollerSim(t, captchasim.Config{Seed: 22, DropRate: 1, PingbackMethod: "GET"})
	rejecting := newPollerSim(t, captchasim.Config{Seed: 23, DropRate: 1})
	// The faults: simulators that answer every res.php request with an
	// HTML 5xx page, or with ERROR_NO_SLOT_AVAILABLE.
	serverErrors := newPollerSim(t, captchasim.Config{ServerErrorRate: 1})
	noSlots := newPollerSim(t, captchasim.Config{NoSlotRate: 1})
	down.setFault(serverErrors)
	busy.setFault(noSlots)
	// The account's key, accepted when the tasks were submitted, is
	// rejected by res.php (revoked since).
	rejecting.setFault(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.FormValue("json") == "1" {
			_, _ = io.WriteString(w, `{"status":0,"request":"ERROR_KEY_DOES_NOT_EXIST"}`)
			return
		}
		_, _ = io.WriteString(w, "ERROR_KEY_DOES_NOT_EXIST")
	}))

	app := newAppStub(t)
	env := startPollerCaddy(t, pollBlock("after 1s", "interval 5s"), app,
		pollerRoute{provider: "2captcha", sim: down},
		pollerRoute{provider: "captchaai", sim: busy},
		pollerRoute{provider: "rucaptcha", sim: rejecting},
	)
	// Backoff without jitter: exactly the 5s floor, so the outage lasts
	// two failed rounds and the test stays short. The poll loop reads
	// jitter after taking the store handle's lock each tick; owns takes
	// it too, ordering this write before those reads.
	a := runningApp(t)
	a.jitter = func(int64) int64 { return 0 }
	_ = a.handle.owns(a)

	start := time.Now()
	tasks := submitTasks(t,
		taskSpec{provider: "2captcha", method: "userrecaptcha", n: 4},
		taskSpec{provider: "2captcha", method: "post", n: 2},
		taskSpec{provider: "captchaai", method: "hcaptcha", n: 3},
		taskSpec{provider: "captchaai", method: "post", n: 1},
		taskSpec{provider: "rucaptcha", method: "turnstile", n: 2},
		taskSpec{provider: "rucaptcha", method: "post", n: 1},
	)
	recovering := append(tasksOf(tasks, "2captcha", ""), tasksOf(tasks, "captchaai", "")...)

	// Each outage ends after its second failed round.
	type outage struct {
		sim   *pollerSim
		fault *pollerSim
		ended time.Time
	}
	outages := map[string]*outage{"5xx": {sim: down, fault: serverErrors}, "no slot": {sim: busy, fault: noSlots}}
	testkit.WaitFor(t, 2*testPollInterval+pollSlack, "two failed rounds of each outage", func() bool {
		done := true
		for _, o := range outages {
			if o.ended.IsZero() && len(o.sim.faultCalls()) >= 2 {
				o.sim.setFault(nil)
				o.ended = time.Now()
			}
			done = done && !o.ended.IsZero()
		}
		return done
	})
	testkit.WaitFor(t, testPollInterval+pollSlack, "every task to reach the app after the outages", func() bool { return allReceived(app, recovering) })
	t.Logf("outages over and all results delivered %s after submission", time.Since(start).Round(time.Millisecond))
	waitSettled(t, recovering)
	got := receivedOnce(t, app, recovering)
	for _, pt := range recovering {
		if r, ok := got[pt.key()]; ok {
			checkPolled(t, r, pt, "/cb/"+pt.provider, env.sims[pt.provider].code(t, pt.id))
		}
	}

	for name, o := range outages {
		t.Run(name, func(t *testing.T) {
			faults := o.sim.faultCalls()
			for i := 1; i < len(faults); i++ {
				if gap := faults[i].at.Sub(faults[i-1].at); gap < 4500*time.Millisecond {
					t.Errorf("res.php asked again %s after a failure, want the 5s backoff", gap)
				}
			}
			// The 5s floor, less 0.5s for the time between the poller's
			// clock reading and the request's arrival, which varies.
			window := o.ended.Sub(faults[0].at)
			if limit := 1 + int(window/(4500*time.Millisecond)); len(faults) > limit {
				t.Errorf("%d res.php requests during a %s outage, want at most %d", len(faults), window.Round(time.Millisecond), limit)
			}
			st := o.fault.Stats()
			if int(st.ServerErrors+st.NoSlots) != len(faults) {
				t.Errorf("fault simulator injected %d faults for %d requests", st.ServerErrors+st.NoSlots, len(faults))
			}
		})
	}

	t.Run("wrong api key", func(t *testing.T) {
		rejected := tasksOf(tasks, "rucaptcha", "")
		calls := rejecting.resCalls()
		if len(calls) == 0 {
			t.Fatal("the provider was never asked")
		}
		// Quiet for more than an interval after the rejection (already
		// over, normally: the outages took longer).
		if d := time.Until(calls[0].at.Add(testPollInterval + 2*time.Second)); d > 0 {
			testkit.HoldsFor(t, d, "no res.php request after the key was rejected", func() bool { return len(rejecting.resCalls()) == 1 })
		}
		if n := len(rejecting.resCalls()); n != 1 {
			t.Fatalf("%d res.php requests with the rejected key, want exactly 1", n)
		}
		entries := logEntries(t, env.logFile, "provider rejected the API key: polling stopped for this account (its other accounts go on)")
		if len(entries) != 1 || entries[0]["level"] != "error" || entries[0]["provider"] != "rucaptcha" ||
			entries[0]["account"] != accountID("rucaptcha", captchasim.DefaultKey) {
			t.Errorf("key rejection logged as %v, want once at error level for rucaptcha's account", entries)
		}
		if b, err := os.ReadFile(env.logFile); err != nil || bytes.Contains(b, []byte(captchasim.DefaultKey)) {
			t.Errorf("the API key appears in the log (read error: %v)", err)
		}
		// The tasks are kept, not lost: they wait for a working key.
		for _, pt := range rejected {
			if task := getTask(t, pt); task.State != store.TaskPending {
				t.Errorf("%s is %s after the key was rejected, want pending", pt.key(), task.State)
			}
			if n := len(byKey(app)[pt.key()]); n != 0 {
				t.Errorf("app received %d results for %s", n, pt.key())
			}
		}
	})
}

// TestPollerAfterSIGKILL: tasks registered on the admin API are pending
// when Caddy is killed with SIGKILL, before their first poll is due; after
// a restart on the same storage_dir they are polled and each is delivered
// exactly once.
func TestPollerAfterSIGKILL(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("needs SIGKILL")
	}
	const n = 6
	sim := newPollerSim(t, captchasim.Config{Seed: 31, DropRate: 1, PingbackMethod: "GET"})
	app := newAppStub(t)
	dir := t.TempDir()
	const after = 3 * time.Second
	caddyfile := childCaddyfile(dir, fmt.Sprintf(`provider captchaai {
			endpoint %s
			api_key %s
		}
		poll {
			after %s
			interval 5s
		}`, sim.url, captchasim.DefaultKey, after), childPingbackSite(app.HostPort()))
	first := startChildCaddy(t, caddyfile)

	// The app submits directly to the provider and registers each task.
	client := &http.Client{Timeout: 10 * time.Second}
	pingbackURL := childBase + "/cb"
	var tasks []pollerTask
	var registered time.Time
	for i := range n {
		method := "userrecaptcha"
		if i%3 == 0 {
			method = "post"
		}
		id, err := pollerSubmit(client, sim.url, captchasim.DefaultKey, method, false, url.Values{"pingback": {pingbackURL}})
		if err != nil {
			t.Fatalf("submit: %v", err)
		}
		if i == 0 {
			registered = time.Now()
		}
		body := fmt.Sprintf(`{"provider":"captchaai","id":%q,"pingback_url":%q,"method":%q}`, id, pingbackURL, method)
		if a := testkit.Admin(childAdmin).Do(t, http.MethodPost, "/pingback/tasks", body); a.Status != http.StatusCreated {
			t.Fatalf("POST /pingback/tasks: %d %s", a.Status, a.Body)
		}
		tasks = append(tasks, pollerTask{provider: "captchaai", method: method, id: id})
	}

	ps := first.kill()
	if elapsed := time.Since(registered); elapsed >= after {
		t.Fatalf("killed %s after the first registration, not before its poll was due (%s)", elapsed, after)
	}
	if ps.Success() || ps.ExitCode() != -1 {
		t.Fatalf("child caddy ended with %v, want killed by a signal", ps)
	}
	if len(app.Requests()) != 0 || len(sim.resCalls()) != 0 {
		t.Fatalf("tasks were polled before the kill: %d deliveries, %d res.php requests", len(app.Requests()), len(sim.resCalls()))
	}

	second := startChildCaddy(t, caddyfile)
	testkit.WaitFor(t, after+testPollInterval+pollSlack, "every task to reach the app after the restart", func() bool { return allReceived(app, tasks) })
	second.stop() // nothing can reach the app any more
	got := receivedOnce(t, app, tasks)
	for _, pt := range tasks {
		if r, ok := got[pt.key()]; ok {
			checkPolled(t, r, pt, "/cb", sim.code(t, pt.id))
		}
	}
	if n := len(app.Requests()); n != len(tasks) {
		t.Errorf("app received %d requests for %d tasks", n, len(tasks))
	}
}

// TestPollerOneLoopAcrossReloads: config reloads while tasks are due and
// res.php is slow (the old config is mid-round when the new one starts)
// neither deliver a task twice nor ask res.php twice for it: one poll loop
// per store. A result the old config fetched while it was stopping is
// stored and delivered by the new one (a forward the old one had in flight is
// cut and replayed by the new one at once).
func TestPollerOneLoopAcrossReloads(t *testing.T) {
	// Solved at once, pingbacks lost: one res.php request per task is
	// all it takes, and only the poller delivers.
	sim := newPollerSim(t, captchasim.Config{Seed: 41, DropRate: 1})
	sim.setDelay(600 * time.Millisecond)
	app := newAppStub(t)
	routes := []pollerRoute{{provider: "2captcha", sim: sim}}
	gen := func(i int) string {
		return pollBlock("after 1s", "interval 5s") + fmt.Sprintf("\n\t\tretention %dh", 24+i)
	}
	env := startPollerCaddy(t, gen(0), app, routes...)
	handle := runningApp(t).handle

	start := time.Now()
	tasks := submitTasks(t,
		taskSpec{provider: "2captcha", method: "userrecaptcha", n: 3},
		taskSpec{provider: "2captcha", method: "post", n: 6},
	)
	// Reload each time a res.php request starts, three times: each time
	// the running config is waiting for res.php mid-round.
	for i := 1; i <= 3; i++ {
		testkit.WaitFor(t, testPollAfter+testPollInterval+pollSlack-time.Since(start), "a res.php request", func() bool { return len(sim.resCalls()) >= i })
		postLoad(t, adaptCaddyfile(t, pollerCaddyfile(env.dir, env.logFile, gen(i), app, routes)))
	}
	if runningApp(t).handle != handle {
		t.Fatal("the reload opened another store handle")
	}
	testkit.WaitFor(t, testPollInterval+pollSlack, "every task to reach the app", func() bool { return allReceived(app, tasks) })
	waitSettled(t, tasks)
	got := receivedOnce(t, app, tasks)
	sources := map[string]int{}
	for _, pt := range tasks {
		if r, ok := got[pt.key()]; ok {
			sources[r.Header.Get(HeaderSource)]++
			id, code := pingbackFields(t, r)
			if r.Method != http.MethodPost || id != pt.id || code != sim.code(t, pt.id) {
				t.Errorf("%s: delivered as %s with id %q, code ok %v", pt.key(), r.Method, id, code == sim.code(t, pt.id))
			}
			if src := r.Header.Get(HeaderSource); src != "poll" && src != "replay" {
				t.Errorf("%s: %s %q, want poll (or replay)", pt.key(), HeaderSource, src)
			}
		}
		if n := sim.callsFor(pt.id); n != 1 {
			t.Errorf("res.php was asked %d times for %s, want once", n, pt.key())
		}
	}
	t.Logf("delivered by source: %v; %d res.php requests for %d tasks", sources, len(sim.resCalls()), len(tasks))
	handle.mu.Lock()
	apps := len(handle.apps)
	handle.mu.Unlock()
	if apps != 1 {
		t.Errorf("%d configs share the store after the reloads, want 1", apps)
	}
}

// TestBackoffProvider checks the provider backoff: at least 5s or the
// block the answer documents, plus full jitter up to a cap that doubles
// with consecutive failures (5s, 10s, ... up to 10m).
func TestBackoffProvider(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name     string
		failures int // consecutive failures before this one
		ansWait  time.Duration
		jitterOf func(n int64) int64
		wantCap  time.Duration // the jitter bound asked for (exclusive bound n-1)
		want     time.Duration
	}{
		{name: "first failure, no jitter", jitterOf: func(int64) int64 { return 0 },
			wantCap: 5 * time.Second, want: 5 * time.Second},
		{name: "first failure, most jitter", jitterOf: func(n int64) int64 { return n - 1 },
			wantCap: 5 * time.Second, want: 10 * time.Second},
		{name: "third failure, most jitter", failures: 2, jitterOf: func(n int64) int64 { return n - 1 },
			wantCap: 20 * time.Second, want: 25 * time.Second},
		{name: "documented block is the floor", ansWait: 5 * time.Minute, jitterOf: func(int64) int64 { return 0 },
			wantCap: 5 * time.Second, want: 5 * time.Minute},
		{name: "cap stops at 10m", failures: 30, jitterOf: func(n int64) int64 { return n - 1 },
			wantCap: 10 * time.Minute, want: 10*time.Minute + 5*time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var asked int64
			a := &App{logger: zap.NewNop(), jitter: func(n int64) int64 { asked = n; return tc.jitterOf(n) }}
			ps := &accountState{failures: tc.failures}
			a.backoffAccount(store.Account{Provider: "2captcha", ID: "0123456789abcdef"}, ps, now, protocol.Answer{Kind: protocol.Backoff, Code: "x", Wait: tc.ansWait})
			if got := ps.blockedUntil.Sub(now); got != tc.want {
				t.Errorf("blocked for %s, want %s", got, tc.want)
			}
			if want := int64(tc.wantCap) + 1; asked != want {
				t.Errorf("jitter drawn in [0, %s), want [0, %s)", time.Duration(asked), time.Duration(want))
			}
			if ps.failures != tc.failures+1 {
				t.Errorf("failures = %d, want %d", ps.failures, tc.failures+1)
			}
		})
	}
}

// The validated minimums move only with the drill's internal environment,
// never with a config value.
func TestDrillTimerScale(t *testing.T) {
	for _, tc := range []struct {
		env      string
		interval time.Duration
		ok       bool
	}{
		{"", 500 * time.Millisecond, false},
		{"", 5 * time.Second, true},
		{"0.1", 500 * time.Millisecond, true},
		{"0.1", 400 * time.Millisecond, false},
		{"1", 500 * time.Millisecond, false},   // not a scale down
		{"7", 500 * time.Millisecond, false},   // out of range: ignored
		{"abc", 500 * time.Millisecond, false}, // ignored
		{"0.0001", 40 * time.Millisecond, false},
		{"0.0001", 50 * time.Millisecond, true}, // floors
	} {
		t.Run(tc.env+"/"+tc.interval.String(), func(t *testing.T) {
			t.Setenv(drillScaleEnv, tc.env)
			p := &PollConfig{Interval: caddy.Duration(tc.interval), GiveUp: caddy.Duration(DefaultGiveUp), Batch: 1, Rate: 1}
			if err := p.validate(); (err == nil) != tc.ok {
				t.Fatalf("validate: %v, want ok %v", err, tc.ok)
			}
		})
	}
	t.Setenv(drillScaleEnv, "0.1")
	if got := providerBackoffFloor(); got != time.Second {
		t.Errorf("provider back-off floor %s with scale 0.1, want 1s (its own floor)", got)
	}
	if got := pollTick(); got != 100*time.Millisecond {
		t.Errorf("poll tick %s, want 100ms", got)
	}
	if got := (&latencies{}).after(); got != 12*time.Second {
		t.Errorf("auto after %s before samples, want 12s", got)
	}
	t.Setenv(drillScaleEnv, "")
	if providerBackoffFloor() != 5*time.Second || pollTick() != time.Second || (&latencies{}).after() != autoAfterMax {
		t.Error("timers changed without the drill's environment")
	}
}

// TestPolledDeliveriesAreExact: a polled result reaches the app as the
// provider's own pingback would, with everything the provider's answer
// held: for a GET provider (captchaai) the pingback URL's own query kept
// byte for byte (today's main sorted and re-encoded it) with id, code and
// Turnstile's useragent appended; for a POST provider the form with
// useragent after id and code (today's main dropped it).
func TestPolledDeliveriesAreExact(t *testing.T) {
	tests := []struct {
		provider, query, id string
		wantURI             func(id string) string
		wantBody            func(id string) string
	}{
		{"captchaai", "z=1&a=%7e&token=S%2Fe+c", "71000000201",
			func(id string) string {
				return "/cb?z=1&a=%7e&token=S%2Fe+c&id=" + id + "&code=0.4uMMZZdSfsVM8...610cd090&useragent=" +
					url.QueryEscape("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36")
			},
			func(string) string { return "" }},
		{"2captcha", "t=B%2b", "71000000202",
			func(string) string { return "/cb?t=B%2b" },
			func(id string) string {
				return "id=" + id + "&code=0.4uMMZZdSfsVM8...610cd090&useragent=" +
					url.QueryEscape("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36")
			}},
	}
	for _, tc := range tests {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			prov := newTrkProvider(t)
			prov.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(exactTurnstile)})
			startExact(t, tc.provider, prov.URL, pollBlock("after 1s"), app)
			reg := adminRegistration(t, map[string]string{"provider": tc.provider, "id": tc.id, "method": "turnstile",
				"pingback_url": testBase + "/cb?" + tc.query})
			if status, body := adminDo(t, http.MethodPost, "/pingback/tasks", reg); status != http.StatusCreated {
				t.Fatalf("registering: %d %s", status, body)
			}
			key := tc.provider + ":" + tc.id
			defer func() {
				if t.Failed() {
					t.Logf("record: %+v", getRecord(t, tc.provider, tc.id))
				}
			}()
			testkit.WaitFor(t, 10*time.Second, "the polled delivery", func() bool { return app.Count(key) > 0 })
			var got testkit.Received
			for _, r := range app.Requests() {
				if r.Header.Get(HeaderIdempotencyKey) == key {
					got = r
				}
			}
			if got.URI != tc.wantURI(tc.id) || got.Body != tc.wantBody(tc.id) || got.Header.Get(HeaderSource) != "poll" {
				t.Errorf("app got %s %s body %q (source %s)\nwant URI %s body %q",
					got.Method, got.URI, got.Body, got.Header.Get(HeaderSource), tc.wantURI(tc.id), tc.wantBody(tc.id))
			}
			if rec := getRecord(t, tc.provider, tc.id); string(rec.Answer) != exactTurnstile {
				t.Errorf("stored answer %q, want the provider's whole answer", rec.Answer)
			}
			// The app asks res.php itself: answered locally, exactly.
			local := trkDo(t, http.MethodGet, "/res.php?key="+trkKey+"&action=get&json=1&id="+tc.id, "", nil)
			if string(local.body) != exactTurnstile {
				t.Errorf("local answer %q, want %q", local.body, exactTurnstile)
			}
		})
	}
}

// TestJSONProvidersRecoverLostCallbacks: for each JSON-API provider, an
// app that submits with createTask through pingback_track (without a
// callbackUrl, like the official clients) gets the plugin's callbackUrl
// added; with every callback dropped, the plugin polls getTaskResult and
// delivers the result once to the callback route in the provider's own
// callback format (anti-captcha and CapMonster: JSON with a numeric taskId;
// CapSolver: a string taskId; 2captcha API v2: the form id/code), marked
// X-Pingback-Source: poll; the app's later getTaskResult is answered
// locally, exactly as the provider answered.
func TestJSONProvidersRecoverLostCallbacks(t *testing.T) {
	for _, tc := range []struct {
		provider, flavor string
		form, stringID   bool
	}{
		{"anticaptcha", captchasim.FlavorAntiCaptcha, false, false},
		{"capmonster", captchasim.FlavorAntiCaptcha, false, false},
		{"capsolver", captchasim.FlavorCapSolver, false, true},
		{"2captcha", captchasim.Flavor2Captcha, true, false},
		{"rucaptcha", captchasim.Flavor2Captcha, true, false},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			sim := newJSONSim(t, captchasim.Config{JSONFlavor: tc.flavor, DropRate: 1, SolveMin: 200 * time.Millisecond, SolveMax: 500 * time.Millisecond, Seed: 7})
			startJSONCaddy(t, tc.provider, pollBlock("after 1s", "interval 5s"), sim, app, "")
			id := createTask(t, tc.provider)
			info, ok := sim.Task(id)
			if pb, tok, _ := untokened(info.Pingback); !ok || pb != testBase+"/cb/"+tc.provider || tok == "" {
				t.Fatalf("simulator's task %+v: want the callbackUrl the plugin added", info)
			}
			task, err := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: tc.provider, ID: id})
			if err != nil || task.API != "json" || task.Method != "RecaptchaV2TaskProxyless" {
				t.Fatalf("tracked task %+v, %v", task, err)
			}
			key := tc.provider + ":" + id
			testkit.WaitFor(t, 15*time.Second, "the polled delivery", func() bool {
				rec, err := runningApp(t).store(time.Second).Get(t.Context(), store.Key{Provider: tc.provider, ID: id})
				return err == nil && rec.State == store.StateDelivered
			})
			got := deliveriesOf(app, key)
			if len(got) != 1 {
				t.Fatalf("app got %d deliveries, want 1", len(got))
			}
			d := got[0]
			if d.Method != http.MethodPost || d.URI != "/cb/"+tc.provider || d.Header.Get(HeaderSource) != "poll" {
				t.Errorf("delivered as %s %s (source %s)", d.Method, d.URI, d.Header.Get(HeaderSource))
			}
			if tc.form {
				form, _ := url.ParseQuery(d.Body)
				if d.Header.Get("Content-Type") != "application/x-www-form-urlencoded" || form.Get("id") != id || form.Get("code") != info.Code {
					t.Errorf("form delivery %s %q, want id %s code %.20s", d.Header.Get("Content-Type"), d.Body, id, info.Code)
				}
			} else {
				var cb map[string]json.RawMessage
				if d.Header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(d.Body), &cb) != nil {
					t.Fatalf("JSON delivery %s %q", d.Header.Get("Content-Type"), d.Body)
				}
				wantID := id
				if tc.stringID {
					wantID = `"` + id + `"`
				}
				var sol struct{ GRecaptchaResponse string }
				_ = json.Unmarshal(cb["solution"], &sol)
				if string(cb["taskId"]) != wantID || string(cb["status"]) != `"ready"` || sol.GRecaptchaResponse != info.Code {
					t.Errorf("JSON delivery %s, want taskId %s and the token", d.Body, wantID)
				}
			}
			// The app polls by itself now: answered locally.
			calls := sim.Stats().GetTaskResultCalls
			idJSON := id
			if tc.stringID {
				idJSON = `"` + id + `"`
			}
			local := jsonCall(t, tc.provider, "getTaskResult", `{"clientKey":"`+captchasim.DefaultKey+`","taskId":`+idJSON+`}`)
			rec := getRecord(t, tc.provider, id)
			if local.status != http.StatusOK || string(local.body) != string(rec.Answer) || local.header.Get("Content-Type") != "application/json" {
				t.Errorf("local getTaskResult %d %s %q, want the kept answer %q", local.status, local.header.Get("Content-Type"), local.body, rec.Answer)
			}
			if n := sim.Stats().GetTaskResultCalls; n != calls {
				t.Errorf("the local answer reached the provider (%d calls, was %d)", n, calls)
			}
			// A wrong key passes through: the provider judges it.
			wrong := jsonCall(t, tc.provider, "getTaskResult", `{"clientKey":"wrong","taskId":`+idJSON+`}`)
			if !strings.Contains(string(wrong.body), "ERROR_KEY_DOES_NOT_EXIST") {
				t.Errorf("wrong key answered %q", wrong.body)
			}
		})
	}
}
