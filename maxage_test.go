package pingback

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// startCaddyClocked is startCaddy with the app's clock replaced by clock
// from its start on: set as the store opens, before the loops start and
// before any pingback arrives.
func startCaddyClocked(t *testing.T, clock *testkit.Clock, pingbackGlobal, sites string) {
	t.Helper()
	startCaddyFaults(t, &storeFaults{beforeOpen: func(ctx caddy.Context) {
		v, err := ctx.App("pingback")
		if err != nil {
			t.Errorf("pingback app at its store's open: %v", err)
			return
		}
		v.(*App).now = clock.Now
	}}, pingbackGlobal, sites)
}

// ageClock is a test clock that starts at the wall clock's second plus
// 123 ms (so that the age headers' milliseconds show), and never behind
// it: Badger's retention is measured by the wall clock.
func ageClock() *testkit.Clock {
	return testkit.NewClock(time.Now().UTC().Truncate(time.Second).Add(time.Second + 123*time.Millisecond))
}

// maxAgeGlobal is a 2captcha provider block (an api_key, so that tasks
// can be registered; an endpoint nothing answers, never reached: the
// frozen clock never makes a poll due) with the given extra lines, and a
// replay loop whose backoff a one-second advance of the clock outlasts.
func maxAgeGlobal(lines string) string {
	return fmt.Sprintf("provider 2captcha {\n\t\t\tendpoint http://127.0.0.1:1\n\t\t\tapi_key %s\n\t\t\t%s\n\t\t}\n\t\t%s", trkKey, lines, fastReplay)
}

// registerTaskAt registers the 2captcha task id as submitted at at.
func registerTaskAt(t *testing.T, id string, at time.Time) {
	t.Helper()
	if status, body := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{
		"provider": "2captcha", "id": id, "pingback_url": trkCallbackURL, "submitted_at": at.Format(time.RFC3339Nano),
	})); status != http.StatusCreated {
		t.Fatalf("registering %s: %d %s", id, status, body)
	}
}

// postPingback sends the 2captcha pingback of id with extra request
// headers; the provider must get 200 "OK".
func postPingback(t *testing.T, id string, header http.Header) {
	t.Helper()
	req := newTestRequest(t, http.MethodPost, "/cb", "application/x-www-form-urlencoded", []byte("id="+id+"&code=TOKEN-"+id))
	for name, vs := range header {
		req.Header[name] = vs
	}
	if status, body, _ := doRequest(t, req); status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback %s: provider got %d %q, want 200 \"OK\"", id, status, body)
	}
}

// storedLike is a copy of the stored 2captcha record of from as the
// record of id (an id of the same length, so that the stored
// Content-Length still holds), queued for its first forward now.
func storedLike(t *testing.T, from, id string, now time.Time) *store.Record {
	t.Helper()
	rec := *getRecord(t, "2captcha", from)
	if len(id) != len(from) {
		t.Fatalf("ids %q and %q differ in length", from, id)
	}
	rec.ID, rec.Code = id, "TOKEN-"+id
	rec.Request.Body = []byte("id=" + id + "&code=TOKEN-" + id)
	rec.Request.Header = rec.Request.Header.Clone()
	rec.ReceivedAt, rec.SubmittedAt, rec.Tracked = now, time.Time{}, false
	rec.Delivery = store.Delivery{State: store.StateQueued, DueAt: now, UpdatedAt: now}
	rec.ExpiresAt = now.Add(time.Hour)
	return &rec
}

// deliveryAges reads the count and the sum of 2captcha's
// caddy_pingback_delivery_age_seconds for source.
func deliveryAges(t *testing.T, source string) [2]float64 {
	t.Helper()
	var m dto.Metric
	if err := theMetricsOrFail(t).deliveryAge.WithLabelValues("2captcha", source).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return [2]float64{float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum()}
}

// wantAgeHeaders checks the age headers of one request the app received
// against the record's times.
func wantAgeHeaders(t *testing.T, what string, got testkit.Received, received, submitted time.Time) {
	t.Helper()
	if v, want := got.Header.Get(HeaderReceivedAt), received.UTC().Format(ageHeaderLayout); v != want {
		t.Errorf("%s: %s %q, want %q", what, HeaderReceivedAt, v, want)
	}
	want := ""
	if !submitted.IsZero() {
		want = submitted.UTC().Format(ageHeaderLayout)
	}
	if v := got.Header.Values(HeaderSubmittedAt); strings.Join(v, ",") != want {
		t.Errorf("%s: %s %q, want %q", what, HeaderSubmittedAt, v, want)
	}
}

// TestAgeHeadersOnEveryDelivery: the app learns when each result was
// received (and, for a tracked task, submitted) on every delivery: a live
// pingback, a replay after a failure, a replay by hand, a polled result
// and a correction. A provider's own X-Pingback-Received-At never passes.
func TestAgeHeadersOnEveryDelivery(t *testing.T) {
	clock := ageClock()
	app := newAppStub(t)
	app.Tune(func() {
		app.StatusFor = func(r *http.Request) int {
			if r.Header.Get(HeaderIdempotencyKey) == "2captcha:5003" && r.Header.Get(HeaderAttempt) == "1" {
				return http.StatusServiceUnavailable
			}
			return http.StatusOK
		}
	})
	startCaddyClocked(t, clock, maxAgeGlobal(""), pingbackSite("2captcha", "", app))
	c0 := clock.Now()
	ages0 := map[string][2]float64{}
	for _, src := range []string{"callback", "replay", "poll", "correction"} {
		ages0[src] = deliveryAges(t, src)
	}
	if got := c0.Format(ageHeaderLayout); !strings.HasSuffix(got, ".123Z") {
		t.Fatalf("the layout gives %q, want milliseconds and Z", got)
	}

	// Live, untracked, with forged age headers.
	postPingback(t, "5001", http.Header{HeaderReceivedAt: {"1999-01-01T00:00:00.000Z"}, HeaderSubmittedAt: {"1999-01-01T00:00:00.000Z"}})
	// Live, tracked.
	submitted := c0.Add(-90*time.Second - 456*time.Millisecond)
	registerTaskAt(t, "5002", submitted)
	postPingback(t, "5002", nil)
	// The outcome is recorded after the delivery is counted.
	waitForState(t, 5*time.Second, "2captcha", "5001", store.StateDelivered)
	waitForState(t, 5*time.Second, "2captcha", "5002", store.StateDelivered)
	// A replay: its first forward fails.
	postPingback(t, "5003", nil)
	waitForState(t, 5*time.Second, "2captcha", "5003", store.StateFailed)
	clock.Advance(time.Second) // past the backoff
	waitForState(t, 5*time.Second, "2captcha", "5003", store.StateDelivered)
	// A replay by hand, a second later.
	clock.Advance(time.Second)
	if status, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/5001/replay?force=true", ""); status != http.StatusOK {
		t.Fatalf("replay by hand: %d %s", status, body)
	}
	// A polled result of a tracked task, and a correction.
	now := clock.Now()
	polled := storedLike(t, "5001", "5004", now)
	polled.Source, polled.SubmittedAt, polled.Tracked, polled.Verified = store.SourcePoll, now.Add(-time.Minute), true, VerifyResPHP
	insertRecord(t, polled)
	corrected := storedLike(t, "5001", "5005", now.Add(-time.Second))
	corrected.Correction = true
	insertRecord(t, corrected)
	runningApp(t).handle.wake()
	waitForState(t, 5*time.Second, "2captcha", "5004", store.StateDelivered)
	waitForState(t, 5*time.Second, "2captcha", "5005", store.StateDelivered)

	// The histogram of ages at delivery, by source: 0 and 90.456 s live,
	// 1 s and 2 s replayed, 60 s polled (from its submission), 1 s corrected.
	for src, want := range map[string][2]float64{"callback": {2, 90.456}, "replay": {2, 3}, "poll": {1, 60}, "correction": {1, 1}} {
		got := deliveryAges(t, src)
		if n, sum := got[0]-ages0[src][0], got[1]-ages0[src][1]; n != want[0] || math.Abs(sum-want[1]) > 1e-6 {
			t.Errorf("caddy_pingback_delivery_age_seconds{2captcha, %s}: %v deliveries summing %vs, want %v summing %vs", src, n, sum, want[0], want[1])
		}
	}

	for _, tc := range []struct {
		id, source, attempt string
		received, submitted time.Time
		wantRequests, reqAt int
	}{
		{"5001", "callback", "1", c0, time.Time{}, 2, 0},
		{"5002", "callback", "1", c0, submitted, 1, 0},
		{"5003", "replay", "2", c0, time.Time{}, 2, 1},
		{"5001", "replay", "2", c0, time.Time{}, 2, 1},
		{"5004", "poll", "1", now, polled.SubmittedAt, 1, 0},
		{"5005", "correction", "1", now.Add(-time.Second), time.Time{}, 1, 0},
	} {
		what := tc.id + " " + tc.source
		reqs := app.WithKey("2captcha:" + tc.id)
		if tc.id == "5005" {
			reqs = app.WithKey("2captcha:5005:correction")
		}
		if len(reqs) != tc.wantRequests {
			t.Errorf("%s: the app got %d requests, want %d", what, len(reqs), tc.wantRequests)
			continue
		}
		got := reqs[tc.reqAt]
		if got.Header.Get(HeaderSource) != tc.source || got.Header.Get(HeaderAttempt) != tc.attempt {
			t.Errorf("%s: delivered as source %q attempt %q", what, got.Header.Get(HeaderSource), got.Header.Get(HeaderAttempt))
		}
		wantAgeHeaders(t, what, got, tc.received, tc.submitted)
		if rec := getRecord(t, "2captcha", tc.id); !rec.ReceivedAt.Equal(tc.received) || !rec.SubmittedAt.Equal(tc.submitted) {
			t.Errorf("%s: stored received %s submitted %s, want %s and %s", what, rec.ReceivedAt, rec.SubmittedAt, tc.received, tc.submitted)
		}
	}
}

// TestMaxAgeExpiresTooOldResults: with max_age set, a result whose replay
// comes due after the app was down for longer than max_age is kept,
// marked expired, counted and listed, and never forwarded; a younger one
// is replayed; a tracked task's age counts from its submission; a polled
// result older than max_age is expired before any forward; the live
// forward is never held back, however old the task; and a replay by hand
// still delivers an expired result.
func TestMaxAgeExpiresTooOldResults(t *testing.T) {
	clock := ageClock()
	app := newAppStub(t)
	var down atomic.Bool
	app.Tune(func() {
		app.StatusFor = func(r *http.Request) int {
			if down.Load() {
				return http.StatusServiceUnavailable
			}
			return http.StatusOK
		}
	})
	startCaddyClocked(t, clock, maxAgeGlobal("max_age 5m"), pingbackSite("2captcha", "", app))
	expired := func() float64 { return testutil.ToFloat64(maxAgeExpired.WithLabelValues("2captcha", expiredMaxAge)) }
	expired0 := expired()
	wantExpired := func(id string, requests int) {
		t.Helper()
		rec := waitForState(t, 5*time.Second, "2captcha", id, store.StateExpired)
		if rec.ExpiredReason != expiredMaxAge || !rec.DueAt.IsZero() {
			t.Errorf("%s: expired with reason %q, due %s", id, rec.ExpiredReason, rec.DueAt)
		}
		if n := len(app.WithKey("2captcha:" + id)); n != requests {
			t.Errorf("%s: the app got %d requests, want %d", id, n, requests)
		}
	}

	// The app is down for longer than max_age: the live forward fails,
	// and the replay that comes due after max_age is not sent.
	down.Store(true)
	postPingback(t, "6001", nil)
	waitForState(t, 5*time.Second, "2captcha", "6001", store.StateFailed)
	clock.Advance(5*time.Minute + time.Second)
	wantExpired("6001", 1)
	down.Store(false)

	// A younger result is replayed.
	down.Store(true)
	postPingback(t, "6002", nil)
	waitForState(t, 5*time.Second, "2captcha", "6002", store.StateFailed)
	down.Store(false)
	clock.Advance(time.Minute)
	waitForState(t, 5*time.Second, "2captcha", "6002", store.StateDelivered)
	if n := len(app.WithKey("2captcha:6002")); n != 2 {
		t.Errorf("6002: the app got %d requests, want 2 (the live forward and its replay)", n)
	}

	// A tracked task submitted 6 minutes ago: its live forward is sent,
	// its replay a second later is not (6 minutes since submission).
	registerTaskAt(t, "6003", clock.Now().Add(-6*time.Minute))
	down.Store(true)
	postPingback(t, "6003", nil)
	waitForState(t, 5*time.Second, "2captcha", "6003", store.StateFailed)
	down.Store(false)
	clock.Advance(time.Second)
	wantExpired("6003", 1)
	// The same, the app up: delivered live at once, never held.
	old := clock.Now().Add(-10 * time.Minute)
	registerTaskAt(t, "6004", old)
	postPingback(t, "6004", nil)
	if rec := waitForState(t, 5*time.Second, "2captcha", "6004", store.StateDelivered); rec.Attempts != 1 {
		t.Errorf("6004: delivered after %d attempts, want 1 (live)", rec.Attempts)
	}
	if reqs := app.WithKey("2captcha:6004"); len(reqs) != 1 || reqs[0].Header.Get(HeaderSource) != "callback" {
		t.Errorf("6004: the app got %d requests, want the live one", len(reqs))
	} else {
		wantAgeHeaders(t, "6004 live", reqs[0], clock.Now(), old)
	}
	// A polled result of a task submitted 6 minutes ago, fetched now.
	polled := storedLike(t, "6002", "6005", clock.Now())
	polled.Source, polled.SubmittedAt, polled.Tracked = store.SourcePoll, clock.Now().Add(-6*time.Minute), true
	insertRecord(t, polled)
	runningApp(t).handle.wake()
	wantExpired("6005", 0)

	// Counted once the claim that expired them returns.
	testkit.WaitFor(t, 5*time.Second, "caddy_pingback_expired_total{provider=2captcha,reason=max_age} to rise by 3", func() bool {
		return expired()-expired0 == 3
	})
	// Listed by state, with the reason, and counted in the status.
	status, body := adminDo(t, http.MethodGet, "/pingback/records?state=expired", "")
	var page adminapi.RecordsPage
	if status != http.StatusOK || json.Unmarshal(body, &page) != nil {
		t.Fatalf("GET /pingback/records?state=expired: %d %s", status, body)
	}
	var listed []string
	for _, r := range page.Records {
		listed = append(listed, r.ID)
	}
	if strings.Join(listed, ",") != "6001,6003,6005" || !strings.Contains(string(body), `"expired_reason":"max_age"`) {
		t.Errorf("GET /pingback/records?state=expired listed %v: %s", listed, body)
	}
	status, body = adminDo(t, http.MethodGet, "/pingback/status", "")
	var st adminapi.StatusAnswer
	if status != http.StatusOK || json.Unmarshal(body, &st) != nil || st.Records["2captcha"][store.StateExpired] != 3 {
		t.Errorf("GET /pingback/status: %d, records %v, want 3 expired of 2captcha", status, st.Records["2captcha"])
	}

	runCLICases(t, []cliCase{{name: "records --state expired", args: []string{"records", "--address=" + testAdmin, "--state", "expired"},
		out: []string{"2captcha  6001  expired", "2captcha  6003  expired", "2captcha  6005  expired"}, notOut: []string{"6002", "6004"}}})

	// The operator decides: a replay by hand delivers an expired result.
	if status, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/6001/replay", ""); status != http.StatusOK {
		t.Fatalf("replay by hand of an expired result: %d %s", status, body)
	}
	rec := getRecord(t, "2captcha", "6001")
	if rec.State != store.StateDelivered || rec.ExpiredReason != "" {
		t.Errorf("6001 after its replay by hand: %s, reason %q, want delivered and no reason", rec.State, rec.ExpiredReason)
	}
	if reqs := app.WithKey("2captcha:6001"); len(reqs) != 2 {
		t.Errorf("6001: the app got %d requests, want 2", len(reqs))
	}
}

// TestDecideMaxAge is the replay loop's claim policy with max_age: which
// forwards a result's age stops.
func TestDecideMaxAge(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	maxAge := func(p string) time.Duration {
		if p == "2captcha" {
			return 5 * time.Minute
		}
		return 0
	}
	for _, tc := range []struct {
		name                string
		provider            string
		source              store.Source
		received, submitted time.Duration // before now; 0: none
		attempts            int
		correction, lapsed  bool
		want                store.State
	}{
		{"young replay", "2captcha", store.SourceCallback, 4 * time.Minute, 0, 1, false, false, store.StateForwarding},
		{"exactly max_age", "2captcha", store.SourceCallback, 5 * time.Minute, 0, 1, false, false, store.StateForwarding},
		{"old replay", "2captcha", store.SourceCallback, 6 * time.Minute, 0, 1, false, false, store.StateExpired},
		{"old replay of a cut forward", "2captcha", store.SourceCallback, 6 * time.Minute, 0, 1, false, true, store.StateExpired},
		{"tracked: from submission", "2captcha", store.SourceCallback, time.Minute, 6 * time.Minute, 1, false, false, store.StateExpired},
		{"tracked, young", "2captcha", store.SourceCallback, time.Minute, 2 * time.Minute, 1, false, false, store.StateForwarding},
		{"old polled result", "2captcha", store.SourcePoll, time.Second, 6 * time.Minute, 0, false, false, store.StateExpired},
		{"old correction", "2captcha", store.SourceCallback, 6 * time.Minute, 0, 0, true, false, store.StateExpired},
		{"first forward of a pingback that waited", "2captcha", store.SourceCallback, time.Second, 6 * time.Minute, 0, false, false, store.StateForwarding},
		{"first forward of a pingback held by a pause past max_age", "2captcha", store.SourceCallback, 6 * time.Minute, 0, 0, false, false, store.StateExpired},
		{"first forward of a tracked pingback held past max_age", "2captcha", store.SourceCallback, 6 * time.Minute, 7 * time.Minute, 0, false, false, store.StateExpired},
		{"first forward of a pingback held less than max_age", "2captcha", store.SourceCallback, 4 * time.Minute, 0, 0, false, false, store.StateForwarding},
		{"no max_age", "captchaai", store.SourceCallback, time.Hour, 0, 1, false, false, store.StateForwarding},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &store.Record{Provider: tc.provider, ID: "1", Source: tc.source, ReceivedAt: now.Add(-tc.received), Correction: tc.correction}
			if tc.submitted > 0 {
				rec.SubmittedAt, rec.Tracked = now.Add(-tc.submitted), true
			}
			d := store.Delivery{State: store.StateFailed, Attempts: tc.attempts, DueAt: now.Add(-time.Second)}
			decide(now, maxAge)(rec, &d, tc.lapsed)
			if d.State != tc.want {
				t.Fatalf("state %s, want %s", d.State, tc.want)
			}
			switch tc.want {
			case store.StateExpired:
				if d.ExpiredReason != expiredMaxAge || !d.DueAt.IsZero() || d.Attempts != tc.attempts {
					t.Errorf("expired with reason %q, due %s, attempts %d (want max_age, none, %d)", d.ExpiredReason, d.DueAt, d.Attempts, tc.attempts)
				}
			default:
				if d.ExpiredReason != "" || d.Attempts != tc.attempts+1 {
					t.Errorf("claimed with reason %q, attempts %d", d.ExpiredReason, d.Attempts)
				}
			}
		})
	}
}

// TestMaxAgeCaddyfile: max_age in a provider block of the global option,
// with or without an api_key; its mistakes name the line, and a negative
// one is refused by Validate.
func TestMaxAgeCaddyfile(t *testing.T) {
	v, err := parseGlobalOption(caddyfile.NewTestDispenser("pingback {\n\tprovider captchaai {\n\t\tmax_age 90s\n\t}\n}"), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := string(v.(httpcaddyfile.App).Value)
	var app App
	if err := json.Unmarshal([]byte(raw), &app); err != nil {
		t.Fatal(err)
	}
	if pc := app.Providers["captchaai"]; pc == nil || time.Duration(pc.MaxAge) != 90*time.Second || len(pc.APIKey) != 0 {
		t.Errorf("parsed %s, want captchaai's max_age 90s and no api_key", raw)
	}
	if !strings.Contains(raw, `"max_age":90000000000`) {
		t.Errorf("JSON %s has no providers.captchaai.max_age", raw)
	}

	for _, tc := range []struct {
		name, input string
		want        []string
	}{
		{"no value", "pingback {\n\tprovider captchaai {\n\t\tmax_age\n\t}\n}", []string{"wrong argument count", "Testfile:3"}},
		{"not a duration", "pingback {\n\tprovider captchaai {\n\t\tmax_age soon\n\t}\n}", []string{"invalid max_age 'soon'", "Testfile:3"}},
		{"twice", "pingback {\n\tprovider captchaai {\n\t\tmax_age 1m\n\t\tmax_age 2m\n\t}\n}", []string{"max_age specified more than once", "Testfile:4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseGlobalOption(caddyfile.NewTestDispenser(tc.input), nil)
			assertErrHas(t, err, tc.want...)
		})
	}

	validate := func(maxAge string) error {
		t.Helper()
		text := "{\n\tpingback {\n\t\tprovider captchaai {\n\t\t\tmax_age " + maxAge + "\n\t\t}\n\t}\n}\n:8080 {\n\tpingback {\n\t\tprovider captchaai\n\t}\n\trespond 200\n}\n"
		cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(text), nil)
		if err != nil {
			t.Fatalf("adapting max_age %s: %v", maxAge, err)
		}
		var cfg caddy.Config
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			t.Fatal(err)
		}
		return caddy.Validate(&cfg)
	}
	if err := validate("2m"); err != nil {
		t.Errorf("max_age 2m without an api_key: %v", err)
	}
	assertErrHas(t, validate("-1m"), "provider captchaai: max_age must be positive, got -1m0s")
}

// TestMaxAgeExpiredLogThrottled: each expiry is counted; the first 20 a
// minute get a line of their own (key, age, max_age), the rest only the
// minute's summary line per provider, written by the housekeeping.
func TestMaxAgeExpiredLogThrottled(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	ready := make(chan struct{})
	close(ready)
	a := &App{logger: zap.New(core), ready: ready, handle: &storeHandle{expired: newExpiredLog()},
		Providers: map[string]*ProviderConfig{"2captcha": {MaxAge: caddy.Duration(2 * time.Minute)}}}
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	counter := maxAgeExpired.WithLabelValues("2captcha", expiredMaxAge)
	before := testutil.ToFloat64(counter)
	for i := range 25 {
		rec := &store.Record{Provider: "2captcha", ID: fmt.Sprint(7000 + i), ReceivedAt: now.Add(-3 * time.Minute)}
		if i == 0 {
			rec.SubmittedAt = now.Add(-4 * time.Minute)
		}
		d := store.Delivery{State: store.StateFailed, Attempts: 1, DueAt: now}
		if !expireIfTooOld(rec, &d, a.maxAgeOf("2captcha"), now) {
			t.Fatalf("%s not expired", rec.ID)
		}
		rec.Delivery = d
		a.noteMaxAgeExpired(rec)
	}
	if got := testutil.ToFloat64(counter) - before; got != 25 {
		t.Errorf("counted %v expiries, want 25", got)
	}
	lines := logs.FilterMessageSnippet("result expired: older than its provider's max_age").All()
	if len(lines) != 20 {
		t.Fatalf("%d lines of their own, want 20", len(lines))
	}
	first := lines[0].ContextMap()
	if first["key"] != "2captcha:7000" || first["age_since"] != "submitted" || first["age"] != 4*time.Minute || first["max_age"] != 2*time.Minute {
		t.Errorf("first line's fields: %v", first)
	}
	if second := lines[1].ContextMap(); second["age_since"] != "received" || second["age"] != 3*time.Minute {
		t.Errorf("second line's fields: %v", second)
	}
	a.handle.expired.flush(a.logger, zapcore.WarnLevel, "provider")
	summary := logs.FilterMessageSnippet("results expired in the last minute").All()
	if len(summary) != 1 || summary[0].ContextMap()["provider"] != "2captcha" || summary[0].ContextMap()["count"] != int64(25) {
		t.Errorf("summary lines: %v", summary)
	}
}
