package pingback

import (
	"bufio"
	"bytes"
	"context"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// scrapeMetric returns the value of the sample named by its line prefix
// (name{labels}) in the admin endpoint's /metrics, and whether it is there.
func scrapeMetric(t *testing.T, sample string) (float64, bool) {
	t.Helper()
	status, body := adminDo(t, http.MethodGet, "/metrics", "")
	if status != http.StatusOK {
		t.Fatalf("/metrics: %d", status)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if ok && name == sample {
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return v, true
		}
	}
	return 0, false
}

// TestOperationsGauges checks the gauges and the histogram on Caddy's
// /metrics: last_callback_timestamp_seconds moves with a live pingback
// (not with a duplicate), both loops report their rounds while idle, and
// each forward is observed in forward_duration_seconds.
func TestOperationsGauges(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	const last = `caddy_pingback_last_callback_timestamp_seconds{provider="2captcha"}`
	const hist = `caddy_pingback_forward_duration_seconds_count{outcome="delivered",source="callback"}`
	n0, _ := scrapeMetric(t, hist)

	before := float64(time.Now().UnixNano()) / 1e9
	if status, body := testkit.PostForm(t, testBase+"/cb", "id=96&code=T"); status != http.StatusOK {
		t.Fatalf("pingback: %d %s", status, body)
	}
	after := float64(time.Now().UnixNano()) / 1e9
	// The gauge is at most a second stale.
	var v float64
	testkit.WaitFor(t, 3*time.Second, last+" at the pingback's time", func() bool {
		var ok bool
		v, ok = scrapeMetric(t, last)
		return ok && v >= before-1 && v <= after
	})
	if status, _ := testkit.PostForm(t, testBase+"/cb", "id=96&code=T"); status != http.StatusOK {
		t.Fatal("duplicate refused")
	}
	if again, _ := scrapeMetric(t, last); again != v {
		t.Errorf("a duplicate moved %s from %v to %v", last, v, again)
	}
	testkit.WaitFor(t, 5*time.Second, "the forward observed in the histogram", func() bool {
		n, _ := scrapeMetric(t, hist)
		return n == n0+1
	})
	for _, loop := range []string{"replay", "poll"} {
		name := `caddy_pingback_loop_last_run_timestamp_seconds{loop="` + loop + `"}`
		start := float64(time.Now().UnixNano()) / 1e9
		testkit.WaitFor(t, 5*time.Second, name+" moving while idle", func() bool {
			v, _ := scrapeMetric(t, name)
			return v >= start
		})
	}
}

// TestAlertRules checks docs/alerts.yml with promtool (check rules) and
// runs its unit tests on synthetic series (docs/alerts_test.yml). promtool
// comes with the distribution's prometheus package, which .ci/run
// installs; without it the test skips, except in CI (CI set), where it
// fails.
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found (install the prometheus package): the alert rules are not checked")
		}
		t.Skip("SKIPPING the alert rule tests: promtool not found (apt-get install prometheus)")
	}
	for _, args := range [][]string{
		{"check", "rules", "alerts.yml"},
		{"test", "rules", "alerts_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "docs"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// TestAgeGauges checks the age gauges and GET /pingback/status as they
// move: oldest_pending_task_age_seconds rises while a tracked task waits
// and drops to 0 when its pingback arrives; oldest_undelivered_age_seconds
// rises while a result is failed and drops to 0 once it is delivered; and
// last_callback_timestamp_seconds, after a restart, is the newest stored
// live pingback's time (no absence alert because Caddy restarted). The
// status's budget is the poller's (10 requests per tracked task plus
// pollAllowance). Real time, within the gauges' one second of staleness.
func TestAgeGauges(t *testing.T) {
	app := newAppStub(t)
	global := trkGlobal + "\n\t\treplay {\n\t\t\tbackoff 1h 1h\n\t\t}"
	dir := startCaddy(t, global, pingbackSite("2captcha", "", app))
	gauge := func(name string) (float64, bool) {
		return scrapeMetric(t, name+`{provider="2captcha"}`)
	}
	const (
		pendingAge = "caddy_pingback_oldest_pending_task_age_seconds"
		backlogAge = "caddy_pingback_oldest_undelivered_age_seconds"
		lastLive   = "caddy_pingback_last_callback_timestamp_seconds"
	)
	rising := func(name string, pick func(adminapi.StatusAnswer) float64) {
		t.Helper()
		testkit.WaitFor(t, 10*time.Second, name+" at 1.5 s or more", func() bool {
			v, _ := gauge(name)
			return v >= 1.5
		})
		if s := pick(adminStatus(t)); s < 1.5 {
			t.Errorf("status shows %v for %s, want at least 1.5 s as the gauge", s, name)
		}
	}
	zero := func(name string, pick func(adminapi.StatusAnswer) float64) {
		t.Helper()
		testkit.WaitFor(t, 5*time.Second, name+" back to 0", func() bool {
			v, ok := gauge(name)
			return ok && v == 0 && pick(adminStatus(t)) == 0
		})
	}
	statusPending := func(s adminapi.StatusAnswer) float64 { return s.Tasks["2captcha"].OldestPendingAgeSeconds }
	statusBacklog := func(s adminapi.StatusAnswer) float64 { return s.OldestUndeliveredAgeSeconds["2captcha"] }

	// A tracked task waits for its pingback.
	if code, body := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{
		"provider": "2captcha", "id": "74100000001", "pingback_url": trkCallbackURL,
	})); code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, body)
	}
	if v, ok := gauge(backlogAge); ok && v != 0 {
		t.Errorf("%s = %v with nothing failed, want 0", backlogAge, v)
	}
	rising(pendingAge, statusPending)
	if b := adminStatus(t).Budget["2captcha"]; b.Used+b.Left != 10*1+pollAllowance {
		t.Errorf("status budget = %+v with one task tracked, want used + left = %d", b, 10+pollAllowance)
	}
	if code, _ := testkit.PostForm(t, testBase+"/cb", "id=74100000001&code=A"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	zero(pendingAge, statusPending)

	// A result the app refuses waits in state failed (backoff 1h).
	app.SetStatus(http.StatusServiceUnavailable)
	if code, _ := testkit.PostForm(t, testBase+"/cb", "id=602&code=B"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, 5*time.Second, "2captcha", "602", store.StateFailed)
	rising(backlogAge, statusBacklog)
	app.SetStatus(http.StatusOK)
	if code, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/602/replay", ""); code != http.StatusOK {
		t.Fatalf("replay: %d %s", code, body)
	}
	zero(backlogAge, statusBacklog)

	// A polled result stored later is not a live pingback: the newest
	// live one stays 602.
	newest := getRecord(t, "2captcha", "602").ReceivedAt
	now := time.Now().UTC()
	if _, err := runningApp(t).store(time.Second).Insert(context.Background(), &store.Record{
		Provider: "2captcha", ID: "603", Code: "C", Source: store.SourcePoll, ReceivedAt: now,
		Delivery: store.Delivery{State: store.StateDelivered, UpdatedAt: now}, ExpiresAt: now.Add(time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	unloadCaddy(t)
	loadCaddyfile(t, caddyfileFor("storage_dir "+dir+"\n"+global, pingbackSite("2captcha", "", app)))
	v, ok := gauge(lastLive)
	if want := float64(newest.UnixNano()) / 1e9; !ok || math.Abs(v-want) > 1e-3 {
		t.Errorf("after a restart %s = %v (present %v), want the newest stored live pingback's %v", lastLive, v, ok, want)
	}
	if at := adminStatus(t).LastCallbackAt["2captcha"]; !at.Equal(newest) {
		t.Errorf("after a restart status last_callback_at = %v, want %v", at, newest)
	}
}

// TestSetRouteGauges follows the route gauges through a route's
// throttling and recovery: per server and provider, the lowest
// concurrency and the latest pause still ahead; a pair whose routes are
// no longer held back goes back to the replay concurrency and 0; a pair
// never held back has no series; no label holds a path. promlint finds
// nothing to say about the names.
func TestSetRouteGauges(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 39, 2, 0, time.UTC)
	later, latest := now.Add(3*time.Second), now.Add(7500*time.Millisecond)
	const header = `# HELP caddy_pingback_route_paused_until_timestamp_seconds Unix time until which replays of a route are paused (after a 429, or a 503 with Retry-After), by server and provider: the latest among their routes; 0 when none is paused.
# TYPE caddy_pingback_route_paused_until_timestamp_seconds gauge
`
	const concHeader = `# HELP caddy_pingback_route_replay_concurrency Replays of a route that may be in flight at once now, by server and provider: the lowest among their routes (lowered after a 429, or a 503 with Retry-After), the replay concurrency when none is held back.
# TYPE caddy_pingback_route_replay_concurrency gauge
`
	m := &metrics{routeSeries: map[serverProvider]bool{}}
	m.routeReplayConcurrency, m.routePausedUntil = newRouteGauges()
	for _, step := range []struct {
		name   string
		routes []routeGauge
		paused string // the samples of route_paused_until_timestamp_seconds
		conc   string // the samples of route_replay_concurrency
	}{
		{name: "nothing held back", paused: "", conc: ""},
		{name: "one route paused",
			routes: []routeGauge{{Server: "srv0", Provider: "2captcha", Concurrency: 3, PausedUntil: later}},
			paused: `caddy_pingback_route_paused_until_timestamp_seconds{provider="2captcha",server="srv0"} 1.796139545e+09` + "\n",
			conc:   `caddy_pingback_route_replay_concurrency{provider="2captcha",server="srv0"} 3` + "\n"},
		{name: "two routes of one pair, a third pair at max",
			routes: []routeGauge{
				{Server: "srv0", Provider: "2captcha", Concurrency: 3, PausedUntil: later},
				{Server: "srv0", Provider: "2captcha", Concurrency: 1, PausedUntil: latest},
				{Server: "srv0", Provider: "2captcha", Concurrency: 4},
				{Server: "srv1", Provider: "capsolver", Concurrency: 4},
			},
			paused: `caddy_pingback_route_paused_until_timestamp_seconds{provider="2captcha",server="srv0"} 1.7961395495e+09
caddy_pingback_route_paused_until_timestamp_seconds{provider="capsolver",server="srv1"} 0
`,
			conc: `caddy_pingback_route_replay_concurrency{provider="2captcha",server="srv0"} 1
caddy_pingback_route_replay_concurrency{provider="capsolver",server="srv1"} 4
`},
		{name: "a pause that has ended counts as none",
			routes: []routeGauge{{Server: "srv0", Provider: "2captcha", Concurrency: 2, PausedUntil: now}},
			paused: `caddy_pingback_route_paused_until_timestamp_seconds{provider="2captcha",server="srv0"} 0
caddy_pingback_route_paused_until_timestamp_seconds{provider="capsolver",server="srv1"} 0
`,
			conc: `caddy_pingback_route_replay_concurrency{provider="2captcha",server="srv0"} 2
caddy_pingback_route_replay_concurrency{provider="capsolver",server="srv1"} 4
`},
		{name: "recovered: back to the replay concurrency",
			paused: `caddy_pingback_route_paused_until_timestamp_seconds{provider="2captcha",server="srv0"} 0
caddy_pingback_route_paused_until_timestamp_seconds{provider="capsolver",server="srv1"} 0
`,
			conc: `caddy_pingback_route_replay_concurrency{provider="2captcha",server="srv0"} 4
caddy_pingback_route_replay_concurrency{provider="capsolver",server="srv1"} 4
`},
	} {
		m.setRouteGauges(step.routes, 4, now)
		for _, g := range []struct {
			c      *prometheus.GaugeVec
			header string
			want   string
			name   string
		}{
			{m.routePausedUntil, header, step.paused, "caddy_pingback_route_paused_until_timestamp_seconds"},
			{m.routeReplayConcurrency, concHeader, step.conc, "caddy_pingback_route_replay_concurrency"},
		} {
			want := ""
			if g.want != "" {
				want = g.header + g.want
			}
			if err := testutil.CollectAndCompare(g.c, strings.NewReader(want), g.name); err != nil {
				t.Errorf("%s: %v", step.name, err)
			}
			problems, err := testutil.CollectAndLint(g.c)
			if err != nil || len(problems) > 0 {
				t.Errorf("%s: promlint: %v %v", step.name, problems, err)
			}
		}
	}
}
