package pingback

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// pauseGlobal is the pause tests' replay settings: fast retries, one
// forward at a time (so that the app sees the replays in claim order).
const pauseGlobal = "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tconcurrency 1\n\t\t}"

// sendHeldPingback sends the 2captcha pingback of id and fails t unless it is
// answered 200 "OK".
func sendHeldPingback(t *testing.T, id string) {
	t.Helper()
	if status, body := testkit.PostForm(t, testBase+"/cb", "id="+id+"&code=TOKEN-"+id); status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback %s: got %d %q, want 200 OK", id, status, body)
	}
}

// reconnect drops the idle keep-alive connections of the default client,
// which a reload closed.
func reconnect() { http.DefaultTransport.(*http.Transport).CloseIdleConnections() }

// adminRecord reads a record through the admin API, as an operator sees it.
func adminRecord(t *testing.T, provider, id string) store.Record {
	t.Helper()
	status, body := adminDo(t, http.MethodGet, "/pingback/records/"+provider+"/"+id, "")
	var rec store.Record
	if status != http.StatusOK || json.Unmarshal(body, &rec) != nil {
		t.Fatalf("GET record %s:%s: %d %s", provider, id, status, body)
	}
	return rec
}

// listPauses reads GET /pingback/pauses of the admin endpoint admin.
func listPauses(t *testing.T, admin string) []adminapi.Pause {
	t.Helper()
	a := testkit.Admin(admin).Do(t, http.MethodGet, "/pingback/pauses", "")
	var ans adminapi.PausesAnswer
	if a.Status != http.StatusOK || json.Unmarshal(a.Body, &ans) != nil {
		t.Fatalf("GET /pingback/pauses: %d %s", a.Status, a.Body)
	}
	return ans.Pauses
}

// TestPauseHoldsSurvivesAndResumes: a pause during traffic holds every
// forward of the provider (live pingbacks stored queued with no attempt,
// a failed result not retried) and the records show held; a replay by
// hand, single or bulk, is refused 409; the pause survives a reload and a
// restart; the resume delivers each held result once, in received order,
// the held live pingbacks as callbacks at attempt 1.
func TestPauseHoldsSurvivesAndResumes(t *testing.T) {
	app := newAppStub(t)
	app.SetStatus(http.StatusServiceUnavailable)
	site := pingbackSite("2captcha", "", app)
	dir := startCaddy(t, pauseGlobal, site)

	sendHeldPingback(t, "500") // fails: the app is down
	waitForState(t, 5*time.Second, "2captcha", "500", store.StateFailed)

	status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "2captcha", "reason": "deploy"}`)
	var p adminapi.Pause
	if status != http.StatusOK || json.Unmarshal(body, &p) != nil || p.Provider != "2captcha" || p.Reason != "deploy" || p.By != "api" || p.Until != nil {
		t.Fatalf("pause: %d %s", status, body)
	}
	if g := testutil.ToFloat64(pausedGauge.WithLabelValues("2captcha")); g != 1 {
		t.Errorf("caddy_pingback_paused{provider=2captcha} = %v while paused, want 1", g)
	}
	// The failed result may have been retried (backoff 20ms) before the
	// pause, and a retry claimed just before it may still be under way:
	// what the app got and the attempts spent are taken once a whole
	// replay round ran after the pause and no forward of it is left.
	paused := time.Now()
	var round time.Time
	testkit.WaitFor(t, 5*time.Second, "a replay round after the pause", func() bool {
		round = runningApp(t).loopLastRun("replay")
		return round.After(paused)
	})
	testkit.WaitFor(t, 5*time.Second, "a whole replay round after the pause", func() bool {
		return runningApp(t).loopLastRun("replay").After(round)
	})
	failed := waitForState(t, 5*time.Second, "2captcha", "500", store.StateFailed)
	before := len(app.Requests())
	if before != failed.Attempts {
		t.Fatalf("the app got %d requests for %d attempts of the failed result", before, failed.Attempts)
	}
	app.SetStatus(http.StatusOK)
	var held []string
	for i := range 10 {
		id := fmt.Sprint(600 + i)
		held = append(held, id)
		sendHeldPingback(t, id)
	}
	// The replay loop has had its rounds after the failed result was due.
	due := failed.DueAt.Add(200 * time.Millisecond)
	testkit.WaitFor(t, 5*time.Second, "replay rounds after the failed result was due", func() bool {
		return runningApp(t).loopLastRun("replay").After(due)
	})
	if n := len(app.Requests()); n != before {
		t.Fatalf("the app got %d requests while 2captcha was paused, want only the %d of the failed result before the pause", n, before)
	}
	for _, id := range held {
		rec := adminRecord(t, "2captcha", id)
		if rec.State != store.StateQueued || rec.Attempts != 0 || len(rec.History) != 0 || !rec.Held {
			t.Errorf("held pingback %s: state %s, attempts %d, history %d, held %v; want queued, 0, none, held", id, rec.State, rec.Attempts, len(rec.History), rec.Held)
		}
	}
	if rec := adminRecord(t, "2captcha", "500"); rec.State != store.StateFailed || rec.Attempts != failed.Attempts || !rec.Held {
		t.Errorf("failed result while paused: state %s, attempts %d, held %v; want failed, %d, held", rec.State, rec.Attempts, rec.Held, failed.Attempts)
	}

	status, body = adminDo(t, http.MethodPost, "/pingback/records/2captcha/600/replay", "")
	if status != http.StatusConflict || !strings.Contains(string(body), "paused") {
		t.Errorf("replay by hand of a held record: %d %s, want 409 saying the provider is paused", status, body)
	}
	status, body = adminDo(t, http.MethodPost, "/pingback/records/2captcha/500/release", "")
	if status != http.StatusConflict || !strings.Contains(string(body), "paused") {
		t.Errorf("release by hand of a result of a paused provider: %d %s, want 409 saying the provider is paused", status, body)
	}
	status, body = adminDo(t, http.MethodPost, "/pingback/replays", `{"provider": "2captcha", "state": "queued"}`)
	if status != http.StatusConflict || !strings.Contains(string(body), "paused") {
		t.Errorf("bulk replay of a paused provider: %d %s, want 409", status, body)
	}
	var st adminapi.StatusAnswer
	if status, body := adminDo(t, http.MethodGet, "/pingback/status", ""); status != http.StatusOK || json.Unmarshal(body, &st) != nil ||
		len(st.Pauses) != 1 || st.Pauses[0].Provider != "2captcha" || st.Pauses[0].Reason != "deploy" {
		t.Errorf("status: %d, pauses %+v; want the pause of 2captcha", status, st.Pauses)
	}

	// A reload, then a restart: the pause holds.
	global := pauseGlobal + "\n\t\tstorage_dir " + dir
	startCaddy(t, global, site)
	reconnect()
	sendHeldPingback(t, "610")
	held = append(held, "610")
	unloadCaddy(t)
	startCaddy(t, global, site)
	reconnect()
	sendHeldPingback(t, "611")
	held = append(held, "611")
	if ps := listPauses(t, testAdmin); len(ps) != 1 || ps[0].Provider != "2captcha" || ps[0].Reason != "deploy" || !ps[0].Since.Equal(p.Since) {
		t.Fatalf("after a reload and a restart, the pauses are %+v; want 2captcha's, as it was", ps)
	}
	if rec := getRecord(t, "2captcha", "611"); rec.State != store.StateQueued || rec.Attempts != 0 {
		t.Errorf("pingback after the restart: %s, attempts %d; want held", rec.State, rec.Attempts)
	}
	if n := len(app.Requests()); n != before {
		t.Fatalf("the app got %d requests across the reload and restart while paused, want %d", n, before)
	}

	status, body = adminDo(t, http.MethodDelete, "/pingback/pauses/2captcha", "")
	var resumed adminapi.ResumedAnswer
	if status != http.StatusOK || json.Unmarshal(body, &resumed) != nil || resumed.Resumed.Provider != "2captcha" {
		t.Fatalf("resume: %d %s", status, body)
	}
	testkit.WaitFor(t, 10*time.Second, "every held result delivered", func() bool {
		for _, id := range append([]string{"500"}, held...) {
			if app.Count("2captcha:"+id) == 0 {
				return false
			}
		}
		return true
	})
	if g := testutil.ToFloat64(pausedGauge.WithLabelValues("2captcha")); g != 0 {
		t.Errorf("caddy_pingback_paused{provider=2captcha} = %v after the resume, want 0", g)
	}
	var order []string
	for _, r := range app.Requests() {
		id := strings.TrimPrefix(r.Header.Get(HeaderIdempotencyKey), "2captcha:")
		if id == "500" {
			continue
		}
		order = append(order, id)
		if r.Header.Get(HeaderSource) != "callback" || r.Header.Get(HeaderAttempt) != "1" {
			t.Errorf("held pingback %s delivered as %s attempt %s, want callback attempt 1",
				id, r.Header.Get(HeaderSource), r.Header.Get(HeaderAttempt))
		}
	}
	if !slices.Equal(order, held) {
		t.Errorf("held results delivered in the order %v, want the received order %v, each once", order, held)
	}
	for _, id := range held {
		waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	}
}

// TestPauseBadInputAndTimer: bad input is a 400 that changes nothing; a
// DELETE of a provider without a pause is a 404; "*" is a pause of its
// own; a pause with until ends by itself and the held result is
// delivered.
func TestPauseBadInputAndTimer(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, pauseGlobal, pingbackSite("2captcha", "", app))
	for _, tc := range []struct{ body, want string }{
		{`{"provider": "anticaptcha"}`, "unknown provider"},
		{`{"provider": "2captcha", "until": "soon"}`, "RFC 3339"},
		{`{"provider": "2captcha", "until": "2020-01-01T00:00:00Z"}`, "not in the future"},
		{`{"provider": "2captcha", "by": "timer"}`, "by must be"},
	} {
		status, body := adminDo(t, http.MethodPost, "/pingback/pauses", tc.body)
		if status != http.StatusBadRequest || !strings.Contains(string(body), tc.want) {
			t.Errorf("POST %s: %d %s, want 400 saying %q", tc.body, status, body, tc.want)
		}
	}
	if ps := listPauses(t, testAdmin); len(ps) != 0 {
		t.Fatalf("bad input changed the pauses: %+v", ps)
	}
	if status, _ := adminDo(t, http.MethodDelete, "/pingback/pauses/2captcha", ""); status != http.StatusNotFound {
		t.Errorf("DELETE of a provider without a pause: %d, want 404", status)
	}

	// "*" holds every provider, and only its own DELETE removes it.
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "*", "by": "console"}`); status != http.StatusOK {
		t.Fatalf("pause *: %d %s", status, body)
	}
	sendHeldPingback(t, "700")
	if rec := adminRecord(t, "2captcha", "700"); rec.State != store.StateQueued || !rec.Held {
		t.Errorf("pingback while * is paused: %s, held %v; want queued, held", rec.State, rec.Held)
	}
	if status, _ := adminDo(t, http.MethodDelete, "/pingback/pauses/2captcha", ""); status != http.StatusNotFound {
		t.Errorf("DELETE of 2captcha while only * is paused: %d, want 404", status)
	}
	until := time.Now().Add(time.Second).UTC().Format(time.RFC3339Nano)
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "2captcha", "until": "`+until+`", "by": "cli"}`); status != http.StatusOK {
		t.Fatalf("pause with until: %d %s", status, body)
	}
	if status, _ := adminDo(t, http.MethodDelete, "/pingback/pauses/*", ""); status != http.StatusOK {
		t.Fatalf("DELETE *: %d", status)
	}
	if rec := adminRecord(t, "2captcha", "700"); !rec.Held || app.Count("2captcha:700") != 0 {
		t.Errorf("with * resumed and 2captcha still paused: held %v, delivered %d times; want held", rec.Held, app.Count("2captcha:700"))
	}
	testkit.WaitFor(t, 5*time.Second, "the timer to end the pause", func() bool { return len(listPauses(t, testAdmin)) == 0 })
	waitForState(t, 5*time.Second, "2captcha", "700", store.StateDelivered)
	if n := app.Count("2captcha:700"); n != 1 {
		t.Errorf("held result delivered %d times after the timer's resume, want once", n)
	}
}

// TestPauseResumeLiveLatency: with 5,000 results held, the live
// pingbacks that arrive after the resume still reach the app with p99
// under a second (stretched by testkit.Slowdown), while the held backlog
// drains through the replay loop.
func TestPauseResumeLiveLatency(t *testing.T) {
	const backlog, live = 5000, 100
	app := newAppStub(t)
	startDrainCaddy(t, app.URL)
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "captchaai"}`); status != http.StatusOK {
		t.Fatalf("pause: %d %s", status, body)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}, Timeout: 10 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	ids := make([]string, backlog)
	for i := range ids {
		ids[i] = drainBacklogID(i)
	}
	sendBacklog(t, client, ids)
	if n := len(app.Requests()); n != 0 {
		t.Fatalf("the app got %d requests while captchaai was paused", n)
	}
	if status, _ := adminDo(t, http.MethodDelete, "/pingback/pauses/captchaai", ""); status != http.StatusOK {
		t.Fatalf("resume: %d", status)
	}
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := range live {
		<-tick.C
		wg.Go(func() {
			id := drainLiveID(i)
			start := time.Now()
			if what := drainPingback(client, id); what != "" {
				t.Errorf("live pingback %s: %s", id, what)
				return
			}
			mu.Lock()
			lat = append(lat, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	drainedAtEnd := 0
	for _, id := range ids {
		if app.Deliveries("captchaai:"+id) > 0 {
			drainedAtEnd++
		}
	}
	for i := range live {
		if n := app.Deliveries("captchaai:" + drainLiveID(i)); n != 1 {
			t.Errorf("live pingback %s reached the app %d times, want once", drainLiveID(i), n)
		}
	}
	slices.Sort(lat)
	if len(lat) == 0 {
		t.Fatal("no live pingback answered")
	}
	p99 := lat[max(int(math.Ceil(0.99*float64(len(lat))))-1, 0)]
	t.Logf("live after resume: p50 %s, p99 %s, max %s; %d of %d held results delivered meanwhile",
		lat[len(lat)/2], p99, lat[len(lat)-1], drainedAtEnd, backlog)
	if budget := testkit.Slowdown * time.Second; p99 >= budget {
		t.Errorf("live delivery p99 %s after a resume with %d held, want under %s", p99, backlog, budget)
	}
	testkit.WaitFor(t, 120*time.Second, "every held result delivered", func() bool {
		for len(ids) > 0 && app.Deliveries("captchaai:"+ids[0]) > 0 {
			ids = ids[1:]
		}
		return len(ids) == 0
	})
}

// TestPausePostgresHoldsOnEveryInstance: on PostgreSQL, a pause made
// through one instance holds on a second within a second: a pingback the
// second instance receives is held; a resume through the second
// delivers it.
func TestPausePostgresHoldsOnEveryInstance(t *testing.T) {
	app := newAppStub(t)
	cl := newPGCluster(t, "", app.HostPort)
	ins := cl.start(t, 2)
	a := testkit.Admin(ins[0].admin).Do(t, http.MethodPost, "/pingback/pauses", `{"provider": "captchaai", "reason": "migration"}`)
	if a.Status != http.StatusOK {
		t.Fatalf("pause through A: %d %s", a.Status, a.Body)
	}
	paused := time.Now()
	testkit.WaitFor(t, time.Second, "B to see the pause made through A", func() bool {
		ps := listPauses(t, ins[1].admin)
		return len(ps) == 1 && ps[0].Provider == "captchaai" && ps[0].Reason == "migration"
	})
	t.Logf("B held within %s of A's pause", time.Since(paused).Round(time.Millisecond))
	if status, body, err := getWith(http.DefaultClient, ins[1].base()+"/cb?id=4242&code=HELD"); err != nil || status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback to B: %d %q %v", status, body, err)
	}
	recs := ins[1].records(t, store.StateQueued)
	if len(recs) != 1 || recs[0].ID != "4242" || recs[0].Attempts != 0 || !recs[0].Held {
		t.Fatalf("B's queued records %+v; want 4242 held with no attempt", recs)
	}
	if n := app.Count("captchaai:4242"); n != 0 {
		t.Fatalf("the app got the pingback %d times while paused", n)
	}
	if b := testkit.Admin(ins[1].admin).Do(t, http.MethodDelete, "/pingback/pauses/captchaai", ""); b.Status != http.StatusOK {
		t.Fatalf("resume through B: %d %s", b.Status, b.Body)
	}
	testkit.WaitFor(t, 10*time.Second, "the held result delivered", func() bool {
		return len(ins[0].records(t, store.StateDelivered)) == 1
	})
	if n := app.Count("captchaai:4242"); n != 1 {
		t.Errorf("the held result reached the app %d times, want once", n)
	}
}

// TestPausePolledResultsHeld: the polled results of a paused provider are
// stored queued, with no attempt, and held; on resume each reaches the
// app once, as a polled result.
func TestPausePolledResultsHeld(t *testing.T) {
	sim := newPollerSim(t, captchasim.Config{Seed: 36, DropRate: 1, SolveMax: 300 * time.Millisecond})
	app := newAppStub(t)
	startPollerCaddy(t, pollBlock("after 1s", "interval 5s"), app, pollerRoute{provider: "2captcha", sim: sim})
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "2captcha"}`); status != http.StatusOK {
		t.Fatalf("pause: %d %s", status, body)
	}
	tasks := submitTasks(t, taskSpec{provider: "2captcha", method: "userrecaptcha", n: 3})
	st := runningApp(t).store(time.Second)
	testkit.WaitFor(t, 10*time.Second, "every result polled and stored", func() bool {
		for _, pt := range tasks {
			if _, err := st.Get(t.Context(), store.Key{Provider: pt.provider, ID: pt.id}); err != nil {
				return false
			}
		}
		return true
	})
	for _, pt := range tasks {
		rec := adminRecord(t, pt.provider, pt.id)
		if rec.Source != store.SourcePoll || rec.State != store.StateQueued || rec.Attempts != 0 || !rec.Held {
			t.Errorf("polled result %s while paused: source %s, state %s, attempts %d, held %v; want poll, queued, 0, held",
				pt.key(), rec.Source, rec.State, rec.Attempts, rec.Held)
		}
	}
	if n := len(app.Requests()); n != 0 {
		t.Fatalf("the app got %d requests while 2captcha was paused", n)
	}
	if status, _ := adminDo(t, http.MethodDelete, "/pingback/pauses/2captcha", ""); status != http.StatusOK {
		t.Fatalf("resume: %d", status)
	}
	testkit.WaitFor(t, 10*time.Second, "every polled result delivered", func() bool { return allReceived(app, tasks) })
	for _, pt := range tasks {
		got := app.WithKey(pt.key())
		if len(got) != 1 || got[0].Header.Get(HeaderSource) != "poll" {
			t.Errorf("%s reached the app %d times (source %v), want once as poll", pt.key(), len(got), got)
		}
	}
}

// TestPauseCommitFailure: while its provider is paused, a pingback the
// store cannot take is answered exactly as when it is not (a pause never
// changes the provider's answer): forwarded without durability, 200 if
// the app took it, 503 if not; never dropped unstored and unsent.
func TestPauseCommitFailure(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("rucaptcha", "", app))
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "rucaptcha"}`); status != http.StatusOK {
		t.Fatalf("pause: %d %s", status, body)
	}
	if err := runningApp(t).store(time.Second).Close(); err != nil {
		t.Fatalf("closing the store: %v", err)
	}
	for _, tc := range []struct {
		id                string
		appStatus, status int
	}{
		{"9201", http.StatusOK, http.StatusOK},
		{"9202", http.StatusServiceUnavailable, http.StatusServiceUnavailable},
	} {
		app.SetStatus(tc.appStatus)
		if status, body := testkit.PostForm(t, testBase+"/cb", "id="+tc.id+"&code=T"); status != tc.status {
			t.Errorf("paused, store closed, app answered %d: provider got %d %q, want %d", tc.appStatus, status, body, tc.status)
		}
		if n := app.Count("rucaptcha:" + tc.id); n != 1 {
			t.Errorf("paused, store closed, app answered %d: the app received the pingback %d times, want once", tc.appStatus, n)
		}
	}
}
