package pingback

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// fastReplay is a global pingback block whose replay loop retries within
// tens of milliseconds.
const fastReplay = "replay {\n\tbackoff 20ms 40ms\n}"

// runningServerName returns the name of the running config's only http server.
func runningServerName(t *testing.T) string {
	t.Helper()
	v, err := caddy.ActiveContext().App("http")
	if err != nil {
		t.Fatalf("http app: %v", err)
	}
	servers := v.(*caddyhttp.App).Servers
	if len(servers) != 1 {
		t.Fatalf("want one http server, got %d", len(servers))
	}
	for name := range servers {
		return name
	}
	return ""
}

// storedCallback is a record as the handler stores a captchaai GET pingback
// to /cb on the running server, in the given state.
func storedCallback(t *testing.T, id string, state store.State, attempts int, dueAt time.Time) *store.Record {
	t.Helper()
	now := time.Now().UTC()
	return &store.Record{
		Provider:   "captchaai",
		ID:         id,
		Code:       "03AGdBq2" + id,
		Source:     "callback",
		ReceivedAt: now.Add(-time.Minute),
		Server:     runningServerName(t),
		Request: store.Request{
			Method:     http.MethodGet,
			URI:        "/cb?id=" + id + "&code=03AGdBq2" + id,
			Host:       "localhost:" + testHTTPPort,
			Proto:      "HTTP/1.1",
			RemoteAddr: "127.0.0.1:50123",
			Header: http.Header{
				"User-Agent":      {"CaptchaAI-Pingback/1.0"},
				"Accept-Encoding": {"gzip"},
			},
		},
		Delivery:  storedDelivery(state, attempts, dueAt, now),
		ExpiresAt: now.Add(time.Hour),
	}
}

// storedDelivery is a delivery state as the replay loop leaves it: failed
// ones failed every attempt; a forwarding one holds the lease of a process
// that is gone (a crash), so it is claimable at once.
func storedDelivery(state store.State, attempts int, dueAt, now time.Time) store.Delivery {
	d := store.Delivery{State: state, Attempts: attempts, LastStatus: 503, UpdatedAt: now.Add(-time.Minute)}
	switch state {
	case store.StateFailed, store.StateParked:
		d.Failures = attempts
		d.DueAt = dueAt.UTC()
	case store.StateQueued:
		d.DueAt = dueAt.UTC()
	case store.StateForwarding:
		d.LastStatus = 0
		d.Lease = store.Lease{Owner: "badger:0", Until: dueAt.UTC()}
	}
	if state == store.StateParked {
		d.DueAt = time.Time{}
	}
	return d
}

// insertRecord writes rec into the running config's store.
func insertRecord(t *testing.T, rec *store.Record) {
	t.Helper()
	res, err := runningApp(t).store(time.Second).Insert(context.Background(), rec)
	if err != nil || res.Existing != nil {
		t.Fatalf("inserting %s: existing %v, error %v", rec.Key(), res.Existing, err)
	}
}

// TestReplayFailedForward checks that a forward the app failed is replayed
// through the same route with the same request, marked as a replay, and
// ends delivered.
func TestReplayFailedForward(t *testing.T) {
	app := newAppStub(t)
	app.Tune(func() {
		app.StatusFor = func(r *http.Request) int {
			if r.Header.Get(HeaderAttempt) == "1" {
				return http.StatusServiceUnavailable
			}
			return http.StatusOK
		}
	})
	// X-Solver-Trace is not in the stored headers' allowlist: kept for
	// replays by keep_headers.
	startCaddy(t, fastReplay, pingbackSite("2captcha", "keep_headers X-Solver-Trace", app))

	req := newTestRequest(t, http.MethodPost, "/cb?src=test", "application/x-www-form-urlencoded", []byte("id=11001&code=03AGdBq2"))
	req.Header.Set("User-Agent", "2captcha-pingback")
	req.Header.Set("X-Solver-Trace", "abc")
	if status, body, _ := doRequest(t, req); status != http.StatusOK || body != "OK" {
		t.Fatalf("provider got %d %q, want 200 \"OK\"", status, body)
	}
	rec := waitForState(t, 5*time.Second, "2captcha", "11001", store.StateDelivered)
	if rec.Attempts != 2 || rec.LastStatus != 200 || !rec.DueAt.IsZero() {
		t.Errorf("record: attempts %d, last status %d, due %s; want 2, 200, never", rec.Attempts, rec.LastStatus, rec.DueAt)
	}

	seen := app.WithKey("2captcha:11001")
	if len(seen) != 2 {
		t.Fatalf("the app received %d deliveries, want 2", len(seen))
	}
	first, replay := seen[0], seen[1]
	if got := [2]string{first.Header.Get(HeaderSource), first.Header.Get(HeaderAttempt)}; got != [2]string{"callback", "1"} {
		t.Errorf("first delivery: source, attempt %q, want callback, 1", got)
	}
	if got := [2]string{replay.Header.Get(HeaderSource), replay.Header.Get(HeaderAttempt)}; got != [2]string{"replay", "2"} {
		t.Errorf("replay: source, attempt %q, want replay, 2", got)
	}
	if replay.Method != first.Method || replay.URI != first.URI || replay.Host != first.Host || replay.Body != first.Body {
		t.Errorf("replay %s %s Host %s body %q differs from the callback %s %s Host %s body %q",
			replay.Method, replay.URI, replay.Host, replay.Body, first.Method, first.URI, first.Host, first.Body)
	}
	for _, name := range []string{"User-Agent", "X-Solver-Trace", "Content-Type", "Content-Length", HeaderIdempotencyKey} {
		if got, want := replay.Header.Values(name), first.Header.Values(name); !slices.Equal(got, want) || len(want) == 0 {
			t.Errorf("replay %s %q, callback %q: want equal and set", name, got, want)
		}
	}
}

// TestReplayParksAfterMaxAttempts checks that a result the app keeps
// failing is tried max_attempts times in all, then parked and left alone.
func TestReplayParksAfterMaxAttempts(t *testing.T) {
	app := newAppStub(t)
	app.SetStatus(http.StatusServiceUnavailable)
	startCaddy(t, "replay {\n\tbackoff 20ms 40ms\n\tmax_attempts 3\n}", pingbackSite("captchaai", "", app))

	if status, body := testkit.Get(t, testBase+"/cb?id=12001&code=T"); status != http.StatusOK || body != "OK" {
		t.Fatalf("provider got %d %q, want 200 \"OK\"", status, body)
	}
	rec := waitForState(t, 5*time.Second, "captchaai", "12001", store.StateParked)
	if rec.Attempts != 3 || !rec.DueAt.IsZero() || rec.LastStatus != 503 {
		t.Errorf("record: attempts %d, due %s, last status %d; want 3, never, 503", rec.Attempts, rec.DueAt, rec.LastStatus)
	}
	var attempts []string
	for _, r := range app.WithKey("captchaai:12001") {
		attempts = append(attempts, r.Header.Get(HeaderSource)+" "+r.Header.Get(HeaderAttempt))
	}
	if want := []string{"callback 1", "replay 2", "replay 3"}; !slices.Equal(attempts, want) {
		t.Errorf("deliveries %q, want %q", attempts, want)
	}
	// Several backoff periods and loop ticks: no fourth delivery.
	testkit.HoldsFor(t, 300*time.Millisecond, "three deliveries", func() bool {
		return app.Count("captchaai:12001") == 3 && getRecord(t, "captchaai", "12001").State == store.StateParked
	})
}

// TestReplayStartsNothingOnceStopping checks that once a config begins to
// stop (its "stopping" event starts the countdown to the cut), the replay
// loop claims no due record: a forward started then would only be cut,
// burning an attempt and writing an interrupted attempt into the history.
// The record stays due for the next config.
func TestReplayStartsNothingOnceStopping(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, fastReplay, pingbackSite("captchaai", "", app))
	a := runningApp(t)
	a.beginCut()
	insertRecord(t, storedCallback(t, "12501", store.StateFailed, 1, time.Now().Add(-time.Second)))
	inserted := a.now()
	a.handle.wake()
	// Two rounds of the loop ended after the insert: the second began
	// after the record was due.
	var first time.Time
	testkit.WaitFor(t, 5*time.Second, "two replay rounds after the insert", func() bool {
		ran := a.handle.loops.get("replay")
		if first.IsZero() && ran.After(inserted) {
			first = ran
		}
		return !first.IsZero() && ran.After(first)
	})
	rec := getRecord(t, "captchaai", "12501")
	if rec.State != store.StateFailed || rec.Attempts != 1 || len(app.Requests()) != 0 {
		t.Errorf("after the stopping event: %s, attempts %d, %d forwards; want failed, 1, 0", rec.State, rec.Attempts, len(app.Requests()))
	}
}

// TestReplaySkipsRejected checks that a result the app rejected (4xx) stays
// in the dead-letter queue and is never retried automatically.
func TestReplaySkipsRejected(t *testing.T) {
	app := newAppStub(t)
	app.Tune(func() {
		app.StatusFor = func(r *http.Request) int {
			if r.Header.Get(HeaderAttempt) == "1" {
				return http.StatusUnprocessableEntity
			}
			return http.StatusOK
		}
	})
	startCaddy(t, fastReplay, pingbackSite("captchaai", "", app))

	if status, body := testkit.Get(t, testBase+"/cb?id=13001&code=T"); status != http.StatusOK || body != "OK" {
		t.Fatalf("provider got %d %q, want 200 \"OK\"", status, body)
	}
	rec := waitForState(t, 5*time.Second, "captchaai", "13001", store.StateRejected)
	if rec.Attempts != 1 || !rec.DueAt.IsZero() || rec.LastStatus != 422 {
		t.Errorf("record: attempts %d, due %s, last status %d; want 1, never, 422", rec.Attempts, rec.DueAt, rec.LastStatus)
	}
	testkit.HoldsFor(t, 300*time.Millisecond, "one delivery", func() bool {
		return app.Count("captchaai:13001") == 1 && getRecord(t, "captchaai", "13001").State == store.StateRejected
	})
}

// TestReplayRecoversStuck checks that a record left "forwarding" by a crash
// is replayed once its forward is overdue, or parked if it already used
// all its attempts.
func TestReplayRecoversStuck(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\tbackoff 20ms 40ms\n\tmax_attempts 3\n}", pingbackSite("captchaai", "", app))

	// Both were cut by a crash (their lease's owner is gone). The cut
	// attempts are no failures: with max_attempts 3, a record cut on its
	// third attempt is still replayed; one cut maxInterrupts times in a
	// row is parked without another forward.
	stuck := storedCallback(t, "14001", store.StateForwarding, 3, time.Now().Add(time.Hour))
	insertRecord(t, stuck)
	poison := storedCallback(t, "14002", store.StateForwarding, 6, time.Now().Add(time.Hour))
	poison.Interrupts = maxInterrupts - 1
	insertRecord(t, poison)
	// Insert leased them to the running store; hand the leases to a gone
	// owner, as a crash leaves them.
	for _, id := range []string{"14001", "14002"} {
		_, err := runningApp(t).store(time.Second).UpdateDelivery(context.Background(), store.Key{Provider: "captchaai", ID: id},
			func(d *store.Delivery) error { d.Lease.Owner = "badger:0"; return nil })
		if err != nil {
			t.Fatal(err)
		}
	}
	runningApp(t).handle.wake()

	rec := waitForState(t, 5*time.Second, "captchaai", "14001", store.StateDelivered)
	if rec.Attempts != 4 || rec.Failures != 0 || rec.LastStatus != 200 {
		t.Errorf("record: attempts %d, failures %d, last status %d; want 4, 0, 200", rec.Attempts, rec.Failures, rec.LastStatus)
	}
	seen := app.WithKey("captchaai:14001")
	if len(seen) != 1 {
		t.Fatalf("the app received %d deliveries, want 1", len(seen))
	}
	r := seen[0]
	if r.Method != http.MethodGet || r.URI != stuck.Request.URI || r.Host != stuck.Request.Host ||
		r.Header.Get("User-Agent") != "CaptchaAI-Pingback/1.0" ||
		r.Header.Get(HeaderSource) != "replay" || r.Header.Get(HeaderAttempt) != "4" {
		t.Errorf("app saw %s %s Host %s UA %q source %q attempt %q; want the stored request as replay 4",
			r.Method, r.URI, r.Host, r.Header.Get("User-Agent"), r.Header.Get(HeaderSource), r.Header.Get(HeaderAttempt))
	}

	rec = waitForState(t, 5*time.Second, "captchaai", "14002", store.StateParked)
	if rec.Attempts != 6 || rec.Interrupts != maxInterrupts || !rec.DueAt.IsZero() ||
		!strings.Contains(rec.LastError, "forwards in a row were interrupted") {
		t.Errorf("poison record: attempts %d, interrupts %d, due %s, last error %q; want 6, %d, never, interrupted in a row",
			rec.Attempts, rec.Interrupts, rec.DueAt, rec.LastError, maxInterrupts)
	}
	if n := app.Count("captchaai:14002"); n != 0 {
		t.Errorf("the app received the poison record %d times, want never", n)
	}
}

// TestReplayConcurrency checks that the replay loop never has more than
// `concurrency` replays in flight at a slow app.
func TestReplayConcurrency(t *testing.T) {
	app := newAppStub(t)
	app.Tune(func() { app.Delay = 100 * time.Millisecond }) // slow, so replays overlap
	startCaddy(t, "replay {\n\tbackoff 20ms 40ms\n\tconcurrency 2\n}", pingbackSite("captchaai", "", app))

	const n = 10
	due := time.Now().Add(-time.Millisecond)
	for i := range n {
		insertRecord(t, storedCallback(t, fmt.Sprint(15000+i), store.StateFailed, 1, due))
	}
	testkit.WaitFor(t, 10*time.Second, "all replays delivered", func() bool {
		for i := range n {
			if getRecord(t, "captchaai", fmt.Sprint(15000+i)).State != store.StateDelivered {
				return false
			}
		}
		return true
	})
	for i := range n {
		if c := app.Count(fmt.Sprint("captchaai:", 15000+i)); c != 1 {
			t.Errorf("record %d delivered %d times, want once", 15000+i, c)
		}
	}
	if peak := app.PeakInflight(); peak != 2 {
		t.Errorf("the app had at most %d replays in flight, want exactly concurrency (2)", peak)
	}
}

// TestReplayWaitingForSlotCountsNoAttempt: replays that wait for a free
// forward slot are claimed only when one is free, so every counted attempt
// is a request the app received.
func TestReplayWaitingForSlotCountsNoAttempt(t *testing.T) {
	app := newAppStub(t)
	app.Tune(func() { app.Delay = 150 * time.Millisecond })
	startCaddy(t, "replay {\n\tbackoff 20ms 40ms\n\tconcurrency 1\n\tforward_timeout 1s\n}", pingbackSite("captchaai", "", app))

	const n = 8
	for i := range n {
		insertRecord(t, storedCallback(t, fmt.Sprint(33000+i), store.StateFailed, 1, time.Now().Add(-time.Second)))
	}
	runningApp(t).handle.wake()
	for i := range n {
		id := fmt.Sprint(33000 + i)
		rec := waitForState(t, 10*time.Second, "captchaai", id, store.StateDelivered)
		if got := app.Count("captchaai:" + id); rec.Attempts != 1+got || rec.Failures != 1 {
			t.Errorf("%s: %d attempts counted (1 before the test), %d failures, the app received %d; want every attempt a request",
				id, rec.Attempts, rec.Failures, got)
		}
	}
	if peak := app.PeakInflight(); peak != 1 {
		t.Errorf("peak replays in flight %d, want 1", peak)
	}
}
