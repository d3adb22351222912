package pingback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/testfs"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// sendPingbacks sends a captchaai GET pingback for each id at once and
// returns how long each provider waited for its answer; every answer must
// be 200 "OK".
func sendPingbacks(t *testing.T, ids ...string) map[string]time.Duration {
	t.Helper()
	var mu sync.Mutex
	waited := map[string]time.Duration{}
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			start := time.Now()
			resp, err := http.Get(testBase + "/cb?id=" + id + "&code=TOKEN-" + id)
			if err != nil {
				t.Errorf("pingback %s: %v", id, err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			waited[id] = time.Since(start)
			mu.Unlock()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("pingback %s: provider got %d, want 200", id, resp.StatusCode)
			}
		})
	}
	wg.Wait()
	return waited
}

// TestSlowAppGetsEachResultOnce: slow is not stuck. An app that takes 5 s
// or 20 s per request, with forward_timeout 1m, receives each result
// exactly once, and the provider has its 200 within ack_timeout.
func TestSlowAppGetsEachResultOnce(t *testing.T) {
	app := newAppStub(t)
	delays := map[string]time.Duration{"31001": 5 * time.Second, "31002": 20 * time.Second}
	app.Tune(func() {
		app.DelayFor = func(r *http.Request) time.Duration { return delays[r.URL.Query().Get("id")] }
	})
	// A replay loop that looks every 20 ms: a result it took for stuck
	// would be redelivered at once.
	startCaddy(t, "replay {\n\tbackoff 20ms 40ms\n\tforward_timeout 1m\n}", pingbackSite("captchaai", "ack_timeout 1s", app))

	waited := sendPingbacks(t, "31001", "31002")
	for id, d := range waited {
		if d > 1500*time.Millisecond {
			t.Errorf("provider of %s waited %s for its answer, want about ack_timeout (1s)", id, d)
		}
	}
	for id := range delays {
		rec := waitForState(t, 30*time.Second, "captchaai", id, store.StateDelivered)
		if rec.Attempts != 1 || rec.Failures != 0 {
			t.Errorf("%s: attempts %d failures %d, want 1, 0", id, rec.Attempts, rec.Failures)
		}
		key := "captchaai:" + id
		if n, ok := app.Count(key), app.Deliveries(key); n != 1 || ok != 1 {
			t.Errorf("%s: the app received %d requests and delivered %d, want exactly one", id, n, ok)
		}
	}
}

// TestForwardTimeoutIsAFailure: an app slower than forward_timeout has its
// forward cancelled; the attempt counts as failed, says why, and is retried
// after backoff.
func TestForwardTimeoutIsAFailure(t *testing.T) {
	app := newAppStub(t)
	app.Tune(func() {
		app.DelayFor = func(r *http.Request) time.Duration {
			if r.Header.Get(HeaderAttempt) == "1" {
				return time.Minute // cut by forward_timeout long before
			}
			return 0
		}
	})
	startCaddy(t, "replay {\n\tbackoff 1s 1s\n\tforward_timeout 300ms\n}", pingbackSite("captchaai", "ack_timeout 100ms", app))

	sendPingbacks(t, "32001")
	rec := waitForState(t, 5*time.Second, "captchaai", "32001", store.StateFailed)
	if rec.Failures != 1 || rec.Attempts != 1 || rec.LastStatus != 0 || rec.LastError != "app did not answer within forward_timeout" {
		t.Errorf("after the timeout: failures %d attempts %d last status %d last error %q; want 1, 1, 0, the timeout",
			rec.Failures, rec.Attempts, rec.LastStatus, rec.LastError)
	}
	if wait := rec.DueAt.Sub(rec.UpdatedAt); wait < time.Second {
		t.Errorf("retry due %s after the failure, want the backoff (1s)", wait)
	}
	rec = waitForState(t, 5*time.Second, "captchaai", "32001", store.StateDelivered)
	if rec.Attempts != 2 || rec.Failures != 1 {
		t.Errorf("delivered with attempts %d failures %d, want 2, 1", rec.Attempts, rec.Failures)
	}
	if n := app.Deliveries("captchaai:32001"); n != 1 {
		t.Errorf("delivered %d times, want once", n)
	}
	got := testutil.ToFloat64(runningApp(t).metrics.forwards.WithLabelValues("captchaai", "callback", "timeout"))
	if got < 1 {
		t.Errorf("forwards_total{source=callback,outcome=timeout} = %v, want at least 1", got)
	}
}

// TestReloadDuringOutageDoesNotWait: a reload while the app hangs, with
// replays and a live forward in flight, returns at once; the old config's
// forwards are cut 2 s later, recorded as interrupted (not failed) and
// replayed by the new config, and each result is delivered once when the
// app recovers.
func TestReloadDuringOutageDoesNotWait(t *testing.T) {
	app := newAppStub(t)
	hang := make(chan struct{})
	app.Tune(func() { app.Release = hang })
	global := "replay {\n\tbackoff 20ms 40ms\n\tconcurrency 4\n}"
	sites := pingbackSite("captchaai", "ack_timeout 200ms", app)
	dir := startCaddy(t, global, sites)

	ids := []string{"34001", "34002", "34003", "34004"}
	for _, id := range ids {
		insertRecord(t, storedCallback(t, id, store.StateFailed, 1, time.Now().Add(-time.Second)))
	}
	runningApp(t).handle.wake()
	sendPingbacks(t, "34005") // answered at ack_timeout; its forward hangs
	ids = append(ids, "34005")
	testkit.WaitFor(t, 5*time.Second, "four replays and the live forward in flight", func() bool {
		if len(app.Requests()) > 5 {
			for _, r := range app.Requests() {
				t.Logf("%s %s", r.Header.Get(HeaderIdempotencyKey), r.Header.Get(HeaderAttempt))
			}
			t.Fatal("more than 5")
		}
		return len(app.Requests()) == 5
	})

	start := time.Now()
	// The new config has room for all five at once (the app still hangs).
	loadCaddyfile(t, caddyfileFor("storage_dir "+dir+"\nreplay {\n\tbackoff 20ms 40ms\n\tconcurrency 8\n}", sites))
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the reload took %s with forwards in flight, want under 2s", took)
	}
	for _, id := range ids {
		testkit.WaitFor(t, 5*time.Second, id+" cut and replayed by the new config", func() bool {
			return app.Count("captchaai:"+id) >= 2
		})
		rec := getRecord(t, "captchaai", id)
		if rec.Interrupts != 0 || rec.LastError != errCut.Error() {
			t.Errorf("%s after the cut: interrupts %d last error %q; want 0 (a reload is no crash), %q", id, rec.Interrupts, rec.LastError, errCut.Error())
		}
	}
	close(hang) // the app recovers: the new config's forwards are answered
	for _, id := range ids {
		rec := waitForState(t, 5*time.Second, "captchaai", id, store.StateDelivered)
		wantFailures := 1 // the replays' earlier failure; the cut counts none
		if id == "34005" {
			wantFailures = 0
		}
		if rec.Failures != wantFailures {
			t.Errorf("%s: failures %d, want %d", id, rec.Failures, wantFailures)
		}
		if n := app.Deliveries("captchaai:" + id); n != 1 {
			t.Errorf("%s delivered %d times, want once", id, n)
		}
	}
}

// TestStoreFormat1IsReadAndDelivered: a store written by the previous
// stored format (testdata/store-format1.tar.gz, made with that version) is
// upgraded in place: its results read back, the failed one and the one
// whose forward a crash cut are delivered, the final ones stay as they were.
func TestStoreFormat1IsReadAndDelivered(t *testing.T) {
	dir := testfs.Unpack(t, "testdata/store-format1.tar.gz", "format1")
	app := newAppStub(t)
	site := fmt.Sprintf(`http://localhost:%s {
	handle /pingback/2captcha {
		pingback {
			provider 2captcha
		}
		reverse_proxy %s
	}
}
`, testHTTPPort, app.HostPort())
	startCaddy(t, "storage_dir "+dir+"\nreplay {\n\tbackoff 20ms 40ms\n}", site)

	for _, tc := range []struct {
		id       string
		want     store.State
		attempts int
		failures int
	}{
		{"101", store.StateDelivered, 1, 0},
		{"102", store.StateDelivered, 4, 3}, // failed 3 times, then replayed
		{"103", store.StateDelivered, 2, 0}, // cut by the crash, then replayed
		{"104", store.StateParked, 20, 20},
		{"105", store.StateRejected, 1, 0},
	} {
		rec := waitForState(t, 5*time.Second, "2captcha", tc.id, tc.want)
		if rec.Code != "CODE-"+tc.id || rec.Attempts != tc.attempts || rec.Failures != tc.failures {
			t.Errorf("%s: code %q attempts %d failures %d, want CODE-%s, %d, %d",
				tc.id, rec.Code, rec.Attempts, rec.Failures, tc.id, tc.attempts, tc.failures)
		}
		wantSent := 0
		if tc.id == "102" || tc.id == "103" {
			wantSent = 1
		}
		if n := app.Deliveries("2captcha:" + tc.id); n != wantSent {
			t.Errorf("%s delivered %d times, want %d", tc.id, n, wantSent)
		}
	}
	for _, r := range app.Requests() {
		if r.Method != http.MethodPost || r.URI != "/pingback/2captcha" || !strings.HasPrefix(r.Body, "id=") ||
			r.Header.Get(HeaderSource) != "replay" {
			t.Errorf("app saw %s %s %q source %q, want the stored POST replayed", r.Method, r.URI, r.Body, r.Header.Get(HeaderSource))
		}
	}
	task, err := runningApp(t).store(time.Second).GetTask(context.Background(), store.Key{Provider: "2captcha", ID: "106"})
	if err != nil || task.State != store.TaskPending {
		t.Errorf("task 106: %+v, %v; want pending", task, err)
	}
}

// TestFailedForwardsAreLogged: each failed attempt has a warn line with
// key, attempt, status and reason, up to a budget a minute, and the
// minute's summary names the route and how many failed.
func TestFailedForwardsAreLogged(t *testing.T) {
	app := newAppStub(t)
	app.SetStatus(http.StatusServiceUnavailable)
	startCaddy(t, "replay {\n\tbackoff 1h 1h\n}", pingbackSite("captchaai", "", app))
	a := runningApp(t)
	core, logs := observer.New(zapcore.WarnLevel)
	a.logger = zap.New(core)

	n := failureLinesPerWindow + 5
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(35000 + i)
	}
	sendPingbacks(t, ids...)
	testkit.WaitFor(t, 5*time.Second, "every forward to fail", func() bool {
		return app.Count("captchaai:"+ids[n-1]) == 1 && len(app.Requests()) == n
	})
	testkit.WaitFor(t, 5*time.Second, "the failures to be logged", func() bool {
		return logs.FilterMessageSnippet("forward to the app failed").Len() == failureLinesPerWindow
	})
	line := logs.FilterMessageSnippet("forward to the app failed").All()[0]
	f := line.ContextMap()
	if f["attempt"] != int64(1) || f["status"] != int64(503) || f["reason"] != "app answered 503" ||
		!strings.HasPrefix(fmt.Sprint(f["key"]), "captchaai:350") || f["route"] != "localhost:"+testHTTPPort+"/cb" {
		t.Errorf("failure line fields %v", f)
	}
	a.housekeeping()
	sum := logs.FilterMessageSnippet("forwards to this route failed in the last minute").All()
	if len(sum) != 1 || sum[0].ContextMap()["count"] != int64(n) || sum[0].ContextMap()["route"] != "localhost:"+testHTTPPort+"/cb" {
		t.Errorf("summary lines %v, want one naming the route with count %d", sum, n)
	}
}

// TestExpiryIsNeverSilent: a result whose retention ends before it was
// delivered is counted by provider and state and logged.
func TestExpiryIsNeverSilent(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\tbackoff 1h 1h\n}", pingbackSite("captchaai", "", app))
	a := runningApp(t)
	core, logs := observer.New(zapcore.WarnLevel)
	a.logger = zap.New(core)

	// Both past their retention already.
	parked := storedCallback(t, "36001", store.StateParked, 20, time.Time{})
	parked.ExpiresAt = time.Now().Add(-time.Second)
	insertRecord(t, parked)
	delivered := storedCallback(t, "36002", store.StateDelivered, 1, time.Time{})
	delivered.ExpiresAt = time.Now().Add(-time.Second)
	insertRecord(t, delivered)

	counter := a.metrics.expiredUndelivered.WithLabelValues("captchaai", "parked")
	before := testutil.ToFloat64(counter)
	a.expireUndelivered(a.handle.store)
	if got := testutil.ToFloat64(counter) - before; got != 1 {
		t.Errorf("expired_undelivered_total{captchaai,parked} rose by %v, want 1", got)
	}
	lines := logs.FilterMessageSnippet("expired at retention without having been delivered").All()
	if len(lines) != 1 || lines[0].ContextMap()["key"] != "captchaai:36001" || lines[0].ContextMap()["state"] != "parked" {
		t.Errorf("expiry lines %v, want one for captchaai:36001 (parked)", lines)
	}
}

// TestAbortingRouteDoesNotCrash: a handler after pingback that aborts
// (reverse_proxy does when the app's body breaks off; here Caddy's abort
// directive) panics with http.ErrAbortHandler. On the live path and in
// in-process replays alike that is a failed attempt, never a crash.
func TestAbortingRouteDoesNotCrash(t *testing.T) {
	site := fmt.Sprintf(`http://localhost:%s {
	route /cb {
		pingback {
			provider captchaai
		}
		abort
	}
}
`, testHTTPPort)
	startCaddy(t, "replay {\n\tbackoff 20ms 40ms\n\tmax_attempts 3\n}", site)
	sendPingbacks(t, "41001")
	rec := waitForState(t, 5*time.Second, "captchaai", "41001", store.StateParked)
	if rec.Attempts != 3 || rec.Failures != 3 || !strings.Contains(rec.LastError, "handler aborted the forward") {
		t.Errorf("aborted forwards: attempts %d failures %d last error %q; want 3, 3, handler aborted", rec.Attempts, rec.Failures, rec.LastError)
	}
}

// TestSlowCommitAnswers503InTime: a commit slower than ack_timeout does not
// hold the provider: it gets 503 at ack_timeout (not a 200 for what is not
// yet committed), and the result, once committed, is delivered.
func TestSlowCommitAnswers503InTime(t *testing.T) {
	release := make(chan struct{})
	var held atomic.Bool
	commitFaults := func(o *badgerstore.Options) {
		o.BeforeCommit = func(uint64) error {
			if held.Load() {
				<-release
			}
			return nil
		}
	}
	app := newAppStub(t)
	startCaddyWith(t, commitFaults, "", pingbackSite("captchaai", "ack_timeout 200ms", app))
	held.Store(true)

	start := time.Now()
	status, body, err := getWith(&http.Client{Timeout: 3 * time.Second}, testBase+"/cb?id=42001&code=TOKEN")
	waited := time.Since(start)
	if err != nil {
		close(release)
		t.Fatalf("the provider was not answered while the commit hung: %v", err)
	}
	if status != http.StatusServiceUnavailable || body != "result not stored" || waited > time.Second {
		t.Errorf("provider got %d %q after %s while the commit hung, want 503 \"result not stored\" at about 200ms", status, body, waited)
	}
	held.Store(false)
	close(release)
	var rec *store.Record
	testkit.WaitFor(t, 5*time.Second, "the result to be committed and delivered", func() bool {
		var err error
		rec, err = runningApp(t).store(time.Second).Get(context.Background(), store.Key{Provider: "captchaai", ID: "42001"})
		return err == nil && rec.State == store.StateDelivered
	})
	if n := app.Deliveries("captchaai:42001"); n != 1 || rec.Attempts != 1 {
		t.Errorf("delivered %d times with %d attempts, want once", n, rec.Attempts)
	}
	// The provider's retry is a duplicate.
	if status, body := testkit.Get(t, testBase+"/cb?id=42001&code=TOKEN"); status != http.StatusOK || body != "OK" {
		t.Errorf("retry: %d %q, want 200 OK", status, body)
	}
}

// TestCommitFailureIsNeverAcknowledged: when the store's commit fails (an
// injected fault, the store still open), the provider gets 200 only if the
// app took the result, else 503, and nothing is stored.
func TestCommitFailureIsNeverAcknowledged(t *testing.T) {
	var failing atomic.Bool
	commitFaults := func(o *badgerstore.Options) {
		o.BeforeCommit = func(uint64) error {
			if failing.Load() {
				return errors.New("injected commit failure")
			}
			return nil
		}
	}
	app := newAppStub(t)
	startCaddyWith(t, commitFaults, "", pingbackSite("captchaai", "", app))
	failing.Store(true)

	if status, body := testkit.Get(t, testBase+"/cb?id=43001&code=TOKEN"); status != http.StatusOK || body != "OK" {
		t.Errorf("app up: %d %q, want 200 OK (the app took it)", status, body)
	}
	app.SetStatus(http.StatusServiceUnavailable)
	if status, body := testkit.Get(t, testBase+"/cb?id=43002&code=TOKEN"); status != http.StatusServiceUnavailable || body != "result not stored and not delivered" {
		t.Errorf("app down: %d %q, want 503", status, body)
	}
	// Its re-delivery is not taken for a duplicate of what was never written.
	if status, _ := testkit.Get(t, testBase+"/cb?id=43002&code=TOKEN"); status != http.StatusServiceUnavailable {
		t.Errorf("re-delivery while commits fail: %d, want 503", status)
	}
	failing.Store(false)
	for _, id := range []string{"43001", "43002"} {
		if _, err := runningApp(t).store(time.Second).Get(context.Background(), store.Key{Provider: "captchaai", ID: id}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s after failed commits: %v, want not stored", id, err)
		}
	}
}

// TestLeaseRenewal: on a store whose leases must be renewed (as a shared
// store's are), a forward renews its lease every third of the term while it
// runs; once the lease is lost (another owner claimed the record after it
// lapsed) the renewal fails and the forward is cut at once, so two owners
// never forward the same record at the same time.
func TestLeaseRenewal(t *testing.T) {
	const term = 300 * time.Millisecond
	st, err := badgerstore.Open(badgerstore.Options{Dir: t.TempDir(), LeaseTerm: term})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a := &App{logger: zap.NewNop(), now: time.Now}
	ctx := context.Background()
	now := time.Now().UTC()
	rec := &store.Record{
		Provider: "captchaai", ID: "40001", Code: "TOKEN", Source: store.SourceCallback, ReceivedAt: now,
		Request:   store.Request{Method: http.MethodGet, URI: "/cb?id=40001&code=TOKEN", Host: "localhost"},
		Delivery:  store.Delivery{State: store.StateForwarding, Attempts: 1, Lease: store.Lease{Until: now.Add(term)}, UpdatedAt: now},
		ExpiresAt: now.Add(time.Hour),
	}
	if _, err := st.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	leaseUntil := func() time.Time {
		t.Helper()
		got, err := st.Get(ctx, rec.Key())
		if err != nil {
			t.Fatal(err)
		}
		return got.Lease.Until
	}

	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := a.renewWhileRunning(fctx, cancel, st, rec.Key(), 1, term)
	defer stop()
	first := leaseUntil()
	testkit.WaitFor(t, 5*time.Second, "two renewals", func() bool { return leaseUntil().After(first.Add(term / 2)) })
	if fctx.Err() != nil {
		t.Fatalf("the forward was cut while its renewals succeeded: %v", context.Cause(fctx))
	}

	// Another owner takes the record over: the next renewal fails.
	if _, err := st.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
		d.Attempts++
		d.Lease.Owner = "another instance"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the forward went on after its lease was lost")
	}
	if cause := context.Cause(fctx); !errors.Is(cause, errLeaseLost) {
		t.Errorf("the forward was cut with %v, want errLeaseLost", cause)
	}
	if out := cutShort(outcome{class: retryable, status: http.StatusBadGateway}, context.Cause(fctx)); out.class != interrupted {
		t.Errorf("a forward cut by a lost lease is recorded as %s, want interrupted", out.class)
	}
}

// attemptWant is what one history entry must say.
type attemptWant struct {
	source  store.Source
	status  int
	outcome string
	err     string // "" for none
}

// checkHistory checks a record's history against want, entry by entry:
// numbered 1, 2, ... with their source, the app's status, outcome and
// error, each started no earlier than the one before and ended after it
// started.
func checkHistory(t *testing.T, got []store.Attempt, want []attemptWant) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("history has %d attempts, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Attempt != i+1 || g.Source != w.source || g.Status != w.status || g.Outcome != w.outcome || g.Error != w.err {
			t.Errorf("attempt %d = {%d %s status %d %s %q}, want {%d %s status %d %s %q}", i+1,
				g.Attempt, g.Source, g.Status, g.Outcome, g.Error, i+1, w.source, w.status, w.outcome, w.err)
		}
		if g.StartedAt.IsZero() || g.EndedAt.Before(g.StartedAt) || (i > 0 && g.StartedAt.Before(got[i-1].StartedAt)) {
			t.Errorf("attempt %d: started %v, ended %v (the one before started %v)", i+1, g.StartedAt, g.EndedAt, got[max(i-1, 0)].StartedAt)
		}
	}
}

// TestAttemptHistory follows the history of a record through the paths
// that forward it: the live callback, the replay loop's retry, a replay
// by hand (manual) and a bulk replay job (bulk), through
// GET /pingback/records/<provider>/<id>; the app sees replay for the last
// two.
func TestAttemptHistory(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))
	record := func(id string) *store.Record {
		t.Helper()
		code, body := adminDo(t, http.MethodGet, "/pingback/records/2captcha/"+id, "")
		var rec store.Record
		if code != http.StatusOK || json.Unmarshal(body, &rec) != nil {
			t.Fatalf("GET record %s: %d %s", id, code, body)
		}
		return &rec
	}
	const replayed = `caddy_pingback_forwards_total{outcome="delivered",provider="2captcha",source="replay"}`
	replayed0, _ := scrapeMetric(t, replayed) // the counter is the process's
	failed := attemptWant{store.SourceReplay, http.StatusServiceUnavailable, "failed", "app answered 503"}

	// 601: the live forward fails, the replay loop's retry delivers.
	app.SetStatus(http.StatusServiceUnavailable)
	if code, _ := testkit.PostForm(t, testBase+"/cb", "id=601&code=A"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, 5*time.Second, "2captcha", "601", store.StateFailed)
	app.SetStatus(http.StatusOK)
	waitForState(t, 5*time.Second, "2captcha", "601", store.StateDelivered)
	// 602 and 603: parked after two failures.
	parkWhileAppDown(t, app, "B", "602", "603")
	// 602 replayed by hand; then 603 by a bulk job (602 is delivered by
	// then, so the job matches 603 alone).
	if code, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/602/replay", ""); code != http.StatusOK {
		t.Fatalf("replay 602: %d %s", code, body)
	}
	if code, body := adminDo(t, http.MethodPost, "/pingback/replays", `{"state": "parked"}`); code != http.StatusAccepted {
		t.Fatalf("bulk replay: %d %s", code, body)
	}
	waitForState(t, 5*time.Second, "2captcha", "603", store.StateDelivered)

	live := func(status int, outcome, err string) attemptWant {
		return attemptWant{store.SourceCallback, status, outcome, err}
	}
	for _, tc := range []struct {
		id   string
		want []attemptWant
	}{
		{"601", []attemptWant{live(503, "failed", "app answered 503"), {store.SourceReplay, 200, "delivered", ""}}},
		{"602", []attemptWant{live(503, "failed", "app answered 503"), failed, {store.SourceManual, 200, "delivered", ""}}},
		{"603", []attemptWant{live(503, "failed", "app answered 503"), failed, {store.SourceBulk, 200, "delivered", ""}}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			rec := record(tc.id)
			if rec.Attempts != len(tc.want) {
				t.Errorf("attempts %d, want %d", rec.Attempts, len(tc.want))
			}
			checkHistory(t, rec.History, tc.want)
			// Each forward's header said what the metric label says:
			// callback for the live one, replay for every other.
			n := 0
			for _, r := range app.Requests() {
				if r.Header.Get(HeaderIdempotencyKey) != "2captcha:"+tc.id {
					continue
				}
				n++
				want := "replay"
				if n == 1 {
					want = "callback"
				}
				if src := r.Header.Get(HeaderSource); src != want {
					t.Errorf("forward %d arrived with %s %q, want %q", n, HeaderSource, src, want)
				}
			}
			if n != len(tc.want) {
				t.Errorf("the app saw %d forwards, want %d", n, len(tc.want))
			}
		})
	}
	testkit.WaitFor(t, 5*time.Second, "forwards_total with source replay for the retry and the manual and bulk replays", func() bool {
		v, _ := scrapeMetric(t, replayed)
		return v == replayed0+3
	})
}

// wantHistorySources checks the sources of a stored record's attempts,
// in order: the history names each forward as the app was sent it
// (X-Pingback-Source), manual and bulk replays apart.
func wantHistorySources(t *testing.T, provider, id string, want ...store.Source) {
	t.Helper()
	rec := getRecord(t, provider, id)
	var got []store.Source
	for _, a := range rec.History {
		got = append(got, a.Source)
	}
	if !slices.Equal(got, want) {
		t.Errorf("history of %s:%s has sources %v, want %v", provider, id, got, want)
	}
}

// TestBackoff checks the retry delays: the first retry waits min, each
// later one doubles the cap, and with any jitter the delay stays within
// [min, max].
func TestBackoff(t *testing.T) {
	top := func(n int64) int64 { return n - 1 } // the largest draw
	bottom := func(n int64) int64 { return 0 }  // the smallest draw
	tests := []struct {
		name     string
		min, max time.Duration
		jitter   func(int64) int64
		attempt  int
		want     time.Duration
	}{
		{"attempt 1 is min", time.Second, time.Minute, top, 1, time.Second},
		{"attempt 2 caps at 2·min", time.Second, time.Minute, top, 2, 2 * time.Second},
		{"attempt 3 caps at 4·min", time.Second, time.Minute, top, 3, 4 * time.Second},
		{"attempt 6 caps at 32·min", time.Second, time.Minute, top, 6, 32 * time.Second},
		{"attempt 7 caps at max", time.Second, time.Minute, top, 7, time.Minute},
		{"attempt 1000 caps at max", time.Second, time.Minute, top, 1000, time.Minute},
		{"smallest draw is min", time.Second, time.Minute, bottom, 5, time.Second},
		{"middle draw", time.Second, time.Minute, func(n int64) int64 { return n / 2 }, 3, 2500 * time.Millisecond},
		{"min equals max", 5 * time.Second, 5 * time.Second, top, 10, 5 * time.Second},
		{"defaults, attempt 19", DefaultBackoffMin, DefaultBackoffMax, top, 19, DefaultBackoffMax},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := &App{Replay: &ReplayConfig{BackoffMin: caddy.Duration(tc.min), BackoffMax: caddy.Duration(tc.max)}}
			a.jitter = func(n int64) int64 {
				if n <= 0 {
					t.Fatalf("jitter asked for a draw in [0, %d)", n)
				}
				return tc.jitter(n)
			}
			if got := a.backoff(tc.attempt); got != tc.want {
				t.Errorf("backoff(%d) = %s, want %s", tc.attempt, got, tc.want)
			}
		})
	}

	t.Run("random draws stay within min and max", func(t *testing.T) {
		lo, hi := 20*time.Millisecond, 3*time.Second
		a := &App{Replay: &ReplayConfig{BackoffMin: caddy.Duration(lo), BackoffMax: caddy.Duration(hi)}, jitter: rand.Int64N}
		for attempt := 1; attempt <= 100; attempt++ {
			for range 20 {
				if d := a.backoff(attempt); d < lo || d > hi {
					t.Fatalf("backoff(%d) = %s, outside [%s, %s]", attempt, d, lo, hi)
				}
			}
		}
	})
}

// TestClassify checks how the next handler's status and error decide a
// forward's outcome.
func TestClassify(t *testing.T) {
	refused := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	tests := []struct {
		name       string
		status     int
		err        error
		class      outcomeClass
		wantStatus int
	}{
		{"200", 200, nil, delivered, 200},
		{"nothing written", 0, nil, delivered, 200},
		{"204", 204, nil, delivered, 204},
		{"302", 302, nil, delivered, 302},
		{"304", 304, nil, delivered, 304},
		{"500", 500, nil, retryable, 500},
		{"502", 502, nil, retryable, 502},
		{"503", 503, nil, retryable, 503},
		{"408", 408, nil, retryable, 408},
		{"429", 429, nil, retryable, 429},
		{"400", 400, nil, rejected, 400},
		{"401", 401, nil, rejected, 401},
		{"404", 404, nil, rejected, 404},
		{"409", 409, nil, rejected, 409},
		{"422", 422, nil, rejected, 422},
		{"handler error 502 (refused)", 0, caddyhttp.Error(502, refused), retryable, 502},
		{"handler error 504 (timeout)", 0, caddyhttp.Error(504, context.DeadlineExceeded), retryable, 504},
		{"handler error 499 (canceled)", 0, caddyhttp.Error(499, context.Canceled), retryable, 499},
		{"wrapped handler error 504", 0, fmt.Errorf("proxying: %w", caddyhttp.Error(504, refused)), retryable, 504},
		{"handler error without status", 0, caddyhttp.HandlerError{Err: refused}, retryable, 502},
		{"plain error", 0, refused, retryable, 502},
		{"plain error after a 200 was recorded", 200, refused, retryable, 502},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := classify(tc.status, tc.err)
			if out.class != tc.class || out.status != tc.wantStatus {
				t.Errorf("classify(%d, %v) = %s %d, want %s %d", tc.status, tc.err, out.class, out.status, tc.class, tc.wantStatus)
			}
			if (out.err != nil) != (tc.err != nil) {
				t.Errorf("classify(%d, %v) kept error %v", tc.status, tc.err, out.err)
			}
			if tc.class != delivered && out.errorText() == "" {
				t.Errorf("a %s outcome needs an error text", out.class)
			}
		})
	}
}

// TestApplyOutcomeRetryAfter checks the pinned rule for an answer that
// asks for less traffic: the next attempt is at least max(own backoff,
// min(Retry-After, backoff max)), the attempt is a failure in the
// history, and it does not count toward max_attempts.
func TestApplyOutcomeRetryAfter(t *testing.T) {
	const lo, hi = 200 * time.Millisecond, 30 * time.Second
	now := time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC)
	tests := []struct {
		name     string
		failures int
		out      outcome
		state    store.State
		failed   int           // Failures after
		due      time.Duration // DueAt after, from now
	}{
		{"429 with Retry-After longer than the backoff", 0,
			outcome{class: retryable, status: 429, retryAfter: time.Second}, store.StateFailed, 0, time.Second},
		{"429 with Retry-After shorter than the backoff", 4,
			outcome{class: retryable, status: 429, retryAfter: time.Second}, store.StateFailed, 4, lo * 16},
		{"429 without Retry-After: own backoff", 0,
			outcome{class: retryable, status: 429}, store.StateFailed, 0, lo},
		{"503 with Retry-After capped by backoff max", 0,
			outcome{class: retryable, status: 503, retryAfter: time.Hour}, store.StateFailed, 0, hi},
		{"429 at max_attempts is not parked", 2,
			outcome{class: retryable, status: 429, retryAfter: time.Second}, store.StateFailed, 2, time.Second},
		{"503 without Retry-After counts", 0,
			outcome{class: retryable, status: 503}, store.StateFailed, 1, lo},
		{"503 without Retry-After at max_attempts parks", 2,
			outcome{class: retryable, status: 503}, store.StateParked, 3, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := &App{Replay: &ReplayConfig{BackoffMin: caddy.Duration(lo), BackoffMax: caddy.Duration(hi), MaxAttempts: 3},
				jitter: func(n int64) int64 { return n - 1 }} // the top of the jitter range: the cap
			d := store.Delivery{State: store.StateForwarding, Attempts: 1, Failures: tt.failures}
			d.StartAttempt(store.SourceReplay, now.Add(-time.Second))
			a.applyOutcome(&d, tt.out, now)
			var due time.Duration
			if !d.DueAt.IsZero() {
				due = d.DueAt.Sub(now)
			}
			if d.State != tt.state || d.Failures != tt.failed || due != tt.due {
				t.Fatalf("state %s failures %d due +%v, want %s %d +%v", d.State, d.Failures, due, tt.state, tt.failed, tt.due)
			}
			if h := d.History; len(h) != 1 || h[0].Outcome != "failed" || h[0].Status != tt.out.status {
				t.Fatalf("history %+v, want one failed attempt with status %d", h, tt.out.status)
			}
		})
	}
}

// parkWhileAppDown makes app answer 503, sends a 2captcha pingback with
// code for each id, waits until each is parked (the test's replay config
// gives up quickly), and makes app answer 200 again.
func parkWhileAppDown(t *testing.T, app *testkit.App, code string, ids ...string) {
	t.Helper()
	app.SetStatus(http.StatusServiceUnavailable)
	for _, id := range ids {
		if status, _ := testkit.PostForm(t, testBase+"/cb", "id="+id+"&code="+code); status != http.StatusOK {
			t.Fatal("pingback refused")
		}
		waitForState(t, 5*time.Second, "2captcha", id, store.StateParked)
	}
	app.SetStatus(http.StatusOK)
}
