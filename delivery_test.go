package pingback

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testfs"
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
	app.tune(func() {
		app.delayFor = func(r *http.Request) time.Duration { return delays[r.URL.Query().Get("id")] }
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
		rec := waitForStateWithin(t, 30*time.Second, "captchaai", id, store.StateDelivered)
		if rec.Attempts != 1 || rec.Failures != 0 {
			t.Errorf("%s: attempts %d failures %d, want 1, 0", id, rec.Attempts, rec.Failures)
		}
		key := "captchaai:" + id
		if n, ok := app.count(key), app.deliveries(key); n != 1 || ok != 1 {
			t.Errorf("%s: the app received %d requests and delivered %d, want exactly one", id, n, ok)
		}
	}
}

// waitForStateWithin is waitForState with a timeout.
func waitForStateWithin(t *testing.T, timeout time.Duration, provider, id string, want store.State) *store.Record {
	t.Helper()
	var rec *store.Record
	waitFor(t, timeout, fmt.Sprintf("%s:%s to be %s", provider, id, want), func() bool {
		rec = getRecord(t, provider, id)
		return rec.State == want
	})
	return rec
}

// TestForwardTimeoutIsAFailure: an app slower than forward_timeout has its
// forward cancelled; the attempt counts as failed, says why, and is retried
// after backoff.
func TestForwardTimeoutIsAFailure(t *testing.T) {
	app := newAppStub(t)
	app.tune(func() {
		app.delayFor = func(r *http.Request) time.Duration {
			if r.Header.Get(HeaderAttempt) == "1" {
				return time.Minute // cut by forward_timeout long before
			}
			return 0
		}
	})
	startCaddy(t, "replay {\n\tbackoff 1s 1s\n\tforward_timeout 300ms\n}", pingbackSite("captchaai", "ack_timeout 100ms", app))

	sendPingbacks(t, "32001")
	rec := waitForStateWithin(t, 5*time.Second, "captchaai", "32001", store.StateFailed)
	if rec.Failures != 1 || rec.Attempts != 1 || rec.LastStatus != 0 || rec.LastError != "app did not answer within forward_timeout" {
		t.Errorf("after the timeout: failures %d attempts %d last status %d last error %q; want 1, 1, 0, the timeout",
			rec.Failures, rec.Attempts, rec.LastStatus, rec.LastError)
	}
	if wait := rec.DueAt.Sub(rec.UpdatedAt); wait < time.Second {
		t.Errorf("retry due %s after the failure, want the backoff (1s)", wait)
	}
	rec = waitForStateWithin(t, 5*time.Second, "captchaai", "32001", store.StateDelivered)
	if rec.Attempts != 2 || rec.Failures != 1 {
		t.Errorf("delivered with attempts %d failures %d, want 2, 1", rec.Attempts, rec.Failures)
	}
	if n := app.deliveries("captchaai:32001"); n != 1 {
		t.Errorf("delivered %d times, want once", n)
	}
	got := testutil.ToFloat64(runningApp(t).metrics.forwards.WithLabelValues("captchaai", "callback", "timeout"))
	if got < 1 {
		t.Errorf("forwards_total{source=callback,outcome=timeout} = %v, want at least 1", got)
	}
}

// TestReplayWaitingForSlotCountsNoAttempt: replays that wait for a free
// forward slot are claimed only when one is free, so every counted attempt
// is a request the app received.
func TestReplayWaitingForSlotCountsNoAttempt(t *testing.T) {
	app := newAppStub(t)
	app.tune(func() { app.delay = 150 * time.Millisecond })
	startCaddy(t, "replay {\n\tbackoff 20ms 40ms\n\tconcurrency 1\n\tforward_timeout 1s\n}", pingbackSite("captchaai", "", app))

	const n = 8
	for i := range n {
		insertRecord(t, storedCallback(t, fmt.Sprint(33000+i), store.StateFailed, 1, time.Now().Add(-time.Second)))
	}
	runningApp(t).handle.wake()
	for i := range n {
		id := fmt.Sprint(33000 + i)
		rec := waitForStateWithin(t, 10*time.Second, "captchaai", id, store.StateDelivered)
		if got := app.count("captchaai:" + id); rec.Attempts != 1+got || rec.Failures != 1 {
			t.Errorf("%s: %d attempts counted (1 before the test), %d failures, the app received %d; want every attempt a request",
				id, rec.Attempts, rec.Failures, got)
		}
	}
	if peak := app.peakInflight(); peak != 1 {
		t.Errorf("peak replays in flight %d, want 1", peak)
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
	app.tune(func() { app.release = hang })
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
	waitFor(t, 5*time.Second, "four replays and the live forward in flight", func() bool {
		if len(app.requests()) > 5 {
			for _, r := range app.requests() {
				t.Logf("%s %s", r.Header.Get(HeaderIdempotencyKey), r.Header.Get(HeaderAttempt))
			}
			t.Fatal("more than 5")
		}
		return len(app.requests()) == 5
	})

	start := time.Now()
	// The new config has room for all five at once (the app still hangs).
	loadCaddyfile(t, caddyfileFor("storage_dir "+dir+"\nreplay {\n\tbackoff 20ms 40ms\n\tconcurrency 8\n}", sites))
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the reload took %s with forwards in flight, want under 2s", took)
	}
	for _, id := range ids {
		waitFor(t, 5*time.Second, id+" cut and replayed by the new config", func() bool {
			return app.count("captchaai:"+id) >= 2
		})
		rec := getRecord(t, "captchaai", id)
		if rec.Interrupts != 0 || rec.LastError != errCut.Error() {
			t.Errorf("%s after the cut: interrupts %d last error %q; want 0 (a reload is no crash), %q", id, rec.Interrupts, rec.LastError, errCut.Error())
		}
	}
	close(hang) // the app recovers: the new config's forwards are answered
	for _, id := range ids {
		rec := waitForStateWithin(t, 5*time.Second, "captchaai", id, store.StateDelivered)
		wantFailures := 1 // the replays' earlier failure; the cut counts none
		if id == "34005" {
			wantFailures = 0
		}
		if rec.Failures != wantFailures {
			t.Errorf("%s: failures %d, want %d", id, rec.Failures, wantFailures)
		}
		if n := app.deliveries("captchaai:" + id); n != 1 {
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
`, testHTTPPort, app.hostPort())
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
		rec := waitForStateWithin(t, 5*time.Second, "2captcha", tc.id, tc.want)
		if rec.Code != "CODE-"+tc.id || rec.Attempts != tc.attempts || rec.Failures != tc.failures {
			t.Errorf("%s: code %q attempts %d failures %d, want CODE-%s, %d, %d",
				tc.id, rec.Code, rec.Attempts, rec.Failures, tc.id, tc.attempts, tc.failures)
		}
		wantSent := 0
		if tc.id == "102" || tc.id == "103" {
			wantSent = 1
		}
		if n := app.deliveries("2captcha:" + tc.id); n != wantSent {
			t.Errorf("%s delivered %d times, want %d", tc.id, n, wantSent)
		}
	}
	for _, r := range app.requests() {
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
	app.setStatus(http.StatusServiceUnavailable)
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
	waitFor(t, 5*time.Second, "every forward to fail", func() bool {
		return app.count("captchaai:"+ids[n-1]) == 1 && len(app.requests()) == n
	})
	waitFor(t, 5*time.Second, "the failures to be logged", func() bool {
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
	rec := waitForStateWithin(t, 5*time.Second, "captchaai", "41001", store.StateParked)
	if rec.Attempts != 3 || rec.Failures != 3 || !strings.Contains(rec.LastError, "handler aborted the forward") {
		t.Errorf("aborted forwards: attempts %d failures %d last error %q; want 3, 3, handler aborted", rec.Attempts, rec.Failures, rec.LastError)
	}
}

// withStoreOptions makes the stores the test opens use fn's options.
func withStoreOptions(t *testing.T, fn func(*store.BadgerOptions)) {
	t.Helper()
	testStoreOptions = fn
	t.Cleanup(func() { testStoreOptions = nil })
}

// TestSlowCommitAnswers503InTime: a commit slower than ack_timeout does not
// hold the provider: it gets 503 at ack_timeout (not a 200 for what is not
// yet committed), and the result, once committed, is delivered.
func TestSlowCommitAnswers503InTime(t *testing.T) {
	release := make(chan struct{})
	var held atomic.Bool
	withStoreOptions(t, func(o *store.BadgerOptions) {
		o.BeforeCommit = func(uint64) error {
			if held.Load() {
				<-release
			}
			return nil
		}
	})
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "ack_timeout 200ms", app))
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
	waitFor(t, 5*time.Second, "the result to be committed and delivered", func() bool {
		var err error
		rec, err = runningApp(t).store(time.Second).Get(context.Background(), store.Key{Provider: "captchaai", ID: "42001"})
		return err == nil && rec.State == store.StateDelivered
	})
	if n := app.deliveries("captchaai:42001"); n != 1 || rec.Attempts != 1 {
		t.Errorf("delivered %d times with %d attempts, want once", n, rec.Attempts)
	}
	// The provider's retry is a duplicate.
	if status, body := get(t, testBase+"/cb?id=42001&code=TOKEN"); status != http.StatusOK || body != "OK" {
		t.Errorf("retry: %d %q, want 200 OK", status, body)
	}
}

// TestCommitFailureIsNeverAcknowledged: when the store's commit fails (an
// injected fault, the store still open), the provider gets 200 only if the
// app took the result, else 503, and nothing is stored.
func TestCommitFailureIsNeverAcknowledged(t *testing.T) {
	var failing atomic.Bool
	withStoreOptions(t, func(o *store.BadgerOptions) {
		o.BeforeCommit = func(uint64) error {
			if failing.Load() {
				return errors.New("injected commit failure")
			}
			return nil
		}
	})
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "", app))
	failing.Store(true)

	if status, body := get(t, testBase+"/cb?id=43001&code=TOKEN"); status != http.StatusOK || body != "OK" {
		t.Errorf("app up: %d %q, want 200 OK (the app took it)", status, body)
	}
	app.setStatus(http.StatusServiceUnavailable)
	if status, body := get(t, testBase+"/cb?id=43002&code=TOKEN"); status != http.StatusServiceUnavailable || body != "result not stored and not delivered" {
		t.Errorf("app down: %d %q, want 503", status, body)
	}
	// Its re-delivery is not taken for a duplicate of what was never written.
	if status, _ := get(t, testBase+"/cb?id=43002&code=TOKEN"); status != http.StatusServiceUnavailable {
		t.Errorf("re-delivery while commits fail: %d, want 503", status)
	}
	failing.Store(false)
	for _, id := range []string{"43001", "43002"} {
		if _, err := runningApp(t).store(time.Second).Get(context.Background(), store.Key{Provider: "captchaai", ID: id}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s after failed commits: %v, want not stored", id, err)
		}
	}
}
