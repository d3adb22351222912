package pingback

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/chromedp/chromedp"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// chartHourMinute is what the console history test's scripted hour does
// in its minute i, and so what the charts must show for it.
type chartHourMinute struct {
	stored, duplicates int           // pingbacks stored (delivered live, or held once paused) and re-sent
	failing            int           // of those stored, forwards that fail, then replayed delay later
	delay              time.Duration // of the replays
	parked             int           // more pingbacks whose two attempts fail: parked
	pause              bool          // 2captcha is paused at the minute's start
}

// chartHourPauseAt is the minute of the scripted hour at which 2captcha
// is paused (and stays paused).
const chartHourPauseAt = 45

func chartHour(i int) chartHourMinute {
	m := chartHourMinute{stored: 2 + i%4, duplicates: i % 3, pause: i == chartHourPauseAt}
	if i%6 == 0 && i < chartHourPauseAt {
		m.failing, m.delay = 2, time.Duration(5+4*(i/6))*time.Second
	}
	if i == 31 {
		m.parked = 3
	}
	return m
}

// want is the minute's figures as GET /pingback/history shows them, held
// the number of results held by the pause before it ends, parkedBefore
// the results parked before it ends.
func (m chartHourMinute) want(i, held, parked int) (received, deliveries map[string]int64, backlog int64) {
	received = nonZero(map[string]int64{"stored": int64(m.stored + m.failing + m.parked), "duplicate": int64(m.duplicates)})
	if i >= chartHourPauseAt {
		return received, map[string]int64{}, int64(held + parked)
	}
	deliveries = nonZero(map[string]int64{"delivered": int64(m.stored + m.failing), "failed": int64(m.failing + 2*m.parked),
		"parked": int64(m.parked)})
	return received, deliveries, int64(held + parked)
}

// startChartCaddy loads the console sites on the storage directory dir
// with the app's clock replaced by clock from the store's open on.
func startChartCaddy(t *testing.T, dir string, clock *testkit.Clock, app *testkit.App) {
	t.Helper()
	f := &storeFaults{beforeOpen: func(ctx caddy.Context) {
		v, err := ctx.App("pingback")
		if err != nil {
			t.Errorf("pingback app at its store's open: %v", err)
			return
		}
		v.(*App).now = clock.Now
	}}
	cfg := withStoreFaults(t, adaptCaddyfile(t, caddyfileFor("storage_dir "+dir+"\n"+consoleParkGlobal, consoleSites(app))), f)
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
}

// minuteWritten waits until the running app's history has written the
// minute m (its round after the clock entered the next minute).
func minuteWritten(t *testing.T, m time.Time) {
	t.Helper()
	r := runningApp(t).handle.history
	testkit.WaitFor(t, 5*time.Second, "minute "+m.Format("15:04")+" written", func() bool {
		r.mu.Lock()
		flushed := r.flushed
		r.mu.Unlock()
		return !flushed.Before(m) && !r.writing.Load()
	})
}

// pageCharts is the data the page handed to uPlot, by chart: the x values
// (Unix seconds) and each series' values by label (null where none).
type pageCharts map[string]struct {
	Xs     []int64
	Series map[string][]*float64
}

// TestConsoleChartsOfAScriptedHour plays an hour of real traffic through
// Caddy and the stand-in app on an injected clock, minute by minute
// (pingbacks stored and delivered, duplicates, forwards that fail and are
// replayed later, three results parked, then a pause that holds every
// result), lets each minute's record be written, restarts Caddy on the
// same storage directory, and opens the overview in Chromium: the page's
// range is the server's clock (the injected one, an hour and more behind
// the browser's), and the data the page handed to uPlot is exactly GET
// /pingback/history's points over that range, which are exactly what the
// script sent: received per minute by result, deliveries by outcome, the
// backlog, the delay p50/p95. With PINGBACK_SCREENSHOTS=1 it writes
// docs/console-overview.png (that hour's charts, the pause in force, the
// parked results grouped, a recent notification) and
// docs/console-record.png (a parked record).
func TestConsoleChartsOfAScriptedHour(t *testing.T) {
	b := newBrowserTab(t)
	app := newAppStub(t)
	dir := t.TempDir()
	t0 := time.Now().UTC().Truncate(time.Minute).Add(-65 * time.Minute)
	clock := testkit.NewClock(t0)
	startChartCaddy(t, dir, clock, app)
	t.Cleanup(func() { unloadCaddy(t) })

	held, parked := 0, 0
	heldAt, parkedAt := make([]int, 60), make([]int, 60)
	for i := range 60 {
		m := chartHour(i)
		clock.Advance(time.Second)
		if m.pause {
			if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "2captcha", "reason": "migrating the app"}`); status != http.StatusOK {
				t.Fatalf("pausing 2captcha: %d %s", status, body)
			}
		}
		for k := range m.stored {
			id := fmt.Sprintf("%d%02d", 10+k, i)
			postConsolePingback(t, id, "TOKEN-"+id, nil)
			if i < chartHourPauseAt {
				waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
			} else {
				held++
			}
		}
		for k := range m.duplicates {
			id := fmt.Sprintf("%d%02d", 10+k, i)
			postConsolePingback(t, id, "TOKEN-"+id, nil)
		}
		if m.failing+m.parked > 0 {
			app.SetStatus(http.StatusServiceUnavailable)
			var ids []string
			for k := range m.failing + m.parked {
				id := fmt.Sprintf("%d%02d", 50+k, i)
				ids = append(ids, id)
				postConsolePingback(t, id, "TOKEN-"+id, nil)
				waitForState(t, 5*time.Second, "2captcha", id, store.StateFailed)
			}
			if m.parked > 0 { // their second attempt fails too
				clock.Advance(time.Second)
				for _, id := range ids {
					waitForState(t, 5*time.Second, "2captcha", id, store.StateParked)
				}
				parked += len(ids)
			}
			app.SetStatus(http.StatusOK)
			clock.Advance(m.delay)
			for _, id := range ids[:m.failing] {
				waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
			}
		}
		heldAt[i], parkedAt[i] = held, parked
		clock.Advance(t0.Add(time.Duration(i+1) * time.Minute).Sub(clock.Now())) // the next minute begins
		minuteWritten(t, t0.Add(time.Duration(i)*time.Minute))
	}

	// A restart: the store closes and reopens on the same directory.
	clock.Advance(5 * time.Second)
	unloadCaddy(t)
	startChartCaddy(t, dir, clock, app)

	b.do(t, "overview after the restart", chromedp.Navigate(consoleRoot),
		until(`(document.querySelector('#charts')||{}).dataset?.history === 'shown'`))
	var charts pageCharts
	raw := evalJS[string](t, b, `JSON.stringify(Object.fromEntries([...document.querySelectorAll('#charts [data-chart]')].map((box) =>
		[box.dataset.chart, {xs: box.plot.data[0], series: Object.fromEntries(box.plot.series.slice(1).map((s, i) => [s.label, box.plot.data[i + 1]]))}])))`)
	if err := json.Unmarshal([]byte(raw), &charts); err != nil {
		t.Fatalf("the charts' data %.300s: %v", raw, err)
	}
	// Every y axis is wide enough for its labels (the delay's run to
	// 40,000 ms): none is cut at the page's edge.
	if cut := evalJS[string](t, b, `[...document.querySelectorAll('#charts [data-chart]')].map((box) => {
		const u = box.plot, a = u.axes[1];
		u.ctx.font = a.font[0];
		const widest = Math.max(0, ...(a._values || []).map((v) => u.ctx.measureText(v).width / devicePixelRatio));
		return a._size >= widest + a.ticks.size + a.gap ? '' : box.dataset.chart + ': ' + a._size + ' px for ' + a._values.join(' ');
	}).filter(Boolean).join('; ')`); cut != "" {
		t.Errorf("y axes too narrow for their labels: %s", cut)
	}
	asked := evalJS[string](t, b, `performance.getEntriesByType('resource').map((e) => e.name).find((u) => u.includes('/api/history?'))`)
	u, err := url.Parse(asked)
	if err != nil {
		t.Fatal(err)
	}
	status, body := adminDo(t, http.MethodGet, "/pingback/history?"+u.RawQuery, "")
	var ans adminapi.HistoryAnswer
	if status != http.StatusOK || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("GET /pingback/history?%s: %d %.300s", u.RawQuery, status, body)
	}
	// The page's hour is the server's: it begins with the scripted one.
	if len(ans.Points) != 61 || !ans.Points[0].Minute.Equal(t0) {
		t.Fatalf("the page asked for %s: %d points from %s, want 61 from %s (the server's last hour, not the browser's)",
			u.RawQuery, len(ans.Points), ans.From, t0)
	}

	// The page's data is the API's points.
	for _, name := range []string{"received", "deliveries", "backlog", "delay"} {
		c, ok := charts[name]
		if !ok || len(c.Xs) != len(ans.Points) {
			t.Fatalf("chart %s: %d x values, want %d", name, len(c.Xs), len(ans.Points))
		}
		for k, p := range ans.Points {
			if c.Xs[k] != p.Minute.Unix() {
				t.Fatalf("chart %s: x %d is %d, want %s", name, k, c.Xs[k], p.Minute)
			}
		}
	}
	counts := func(p adminapi.HistoryPoint, chart string) map[string]int64 {
		switch chart {
		case "received":
			return p.Received
		case "deliveries":
			return p.Deliveries
		}
		out := map[string]int64{}
		for st, n := range p.Backlog {
			out[string(st)] = n
		}
		return out
	}
	for _, name := range []string{"received", "deliveries", "backlog"} {
		labels := map[string]bool{}
		for _, p := range ans.Points {
			for k := range counts(p, name) {
				labels[k] = true
			}
		}
		if got, want := slices.Sorted(maps.Keys(charts[name].Series)), slices.Sorted(maps.Keys(labels)); !slices.Equal(got, want) {
			t.Errorf("chart %s shows the series %v, want %v", name, got, want)
		}
		for label, ys := range charts[name].Series {
			for k, p := range ans.Points {
				if ys[k] == nil || int64(*ys[k]) != counts(p, name)[label] {
					t.Errorf("chart %s, %s at %s: %v, want %d", name, label, p.Minute.Format("15:04"), value(ys[k]), counts(p, name)[label])
				}
			}
		}
	}
	for k, p := range ans.Points {
		for q, want := range map[string]float64{"p50": p.DelayMs.P50, "p95": p.DelayMs.P95} {
			got := charts["delay"].Series[q][k]
			if (p.DelayMs.Count == 0) != (got == nil) || (got != nil && !near(*got, want)) {
				t.Errorf("chart delay, %s at %s: %v, want %.3f of %d deliveries", q, p.Minute.Format("15:04"), value(got), want, p.DelayMs.Count)
			}
		}
	}

	// The API's points are what the script sent.
	for i, p := range ans.Points[:60] {
		m := chartHour(i)
		received, deliveries, backlog := m.want(i, heldAt[i], parkedAt[i])
		var inBacklog int64
		for _, n := range p.Backlog {
			inBacklog += n
		}
		if fmt.Sprint(p.Received) != fmt.Sprint(received) || fmt.Sprint(p.Deliveries) != fmt.Sprint(deliveries) || inBacklog != backlog {
			t.Errorf("minute %d: received %v, deliveries %v, backlog %v; want %v, %v and %d in the backlog", i, p.Received, p.Deliveries, p.Backlog, received, deliveries, backlog)
		}
		if want := deliveries["delivered"]; p.DelayMs.Count != want {
			t.Errorf("minute %d: %d delays, want %d", i, p.DelayMs.Count, want)
		}
		switch {
		case m.failing > 0: // the replays are the slowest 2 of 4 to 7
			if ms := float64(m.delay.Milliseconds()); p.DelayMs.P95 < ms*0.4 || p.DelayMs.P95 > ms*2.5 || p.DelayMs.P50 > ms*2.5 {
				t.Errorf("minute %d: delay p50 %.1f ms, p95 %.1f ms; want p95 near the replays' %s", i, p.DelayMs.P50, p.DelayMs.P95, m.delay)
			}
		case p.DelayMs.Count > 0: // live forwards on a clock that stood still
			if p.DelayMs.P95 > store.HistoryBoundsMs[0] {
				t.Errorf("minute %d: delay p95 %.1f ms, want live forwards' 0 ms bucket", i, p.DelayMs.P95)
			}
		}
	}

	// The overview worth showing: the pause in force (its reason given
	// again after the restart: a recent notification), the parked results
	// grouped.
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "2captcha", "reason": "migrating the app"}`); status != http.StatusOK {
		t.Fatalf("pausing 2captcha again: %d %s", status, body)
	}
	b.do(t, "overview to show", chromedp.Navigate(consoleRoot),
		until(`(document.querySelector('#charts')||{}).dataset?.history === 'shown' && document.querySelector('[data-paused="2captcha"]') &&
			document.querySelectorAll('#deadletters [data-group]').length === 1 && document.querySelector('#notifications [data-event="pingback_provider_paused"]')`))
	if text := evalJS[string](t, b, `document.querySelector('#overall').innerText`); !strings.Contains(text, "3 results parked") || !strings.Contains(text, "Deliveries of 2captcha paused") {
		t.Errorf("the overall state reads %q, want the 3 parked results and the pause", text)
	}
	docScreenshot(t, b, "console-overview.png")

	b.do(t, "a parked record", chromedp.Navigate(consoleRoot+"?view=record&provider=2captcha&id=5031"),
		until(`document.querySelector('#record [data-field="parked-at"]')`))
	docScreenshot(t, b, "console-record.png")
}

// value prints a chart value: its number, or null.
func value(v *float64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}
