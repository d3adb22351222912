package pingback

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// consoleHistoryMerged says that this build has GET /pingback/history:
// the overview then draws its charts (canvases), and without it says "no
// history". TestConsoleOverview checks that it matches the admin API.
const consoleHistoryMerged = true

// docScreenshot writes a full-page PNG of the tab to docs/name when
// PINGBACK_SCREENSHOTS=1, and only then: the copies docs/operations.md
// shows.
func docScreenshot(t *testing.T, b *browserTab, name string) {
	t.Helper()
	if os.Getenv("PINGBACK_SCREENSHOTS") != "1" {
		return
	}
	img, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join("docs", name), img, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote docs/%s (%d bytes)", name, len(img))
}

// TestConsoleOverview drives the overview in Chromium: it says OK while
// nothing needs a person, and "needs a person" with the parked results
// once some park; the dead letters show grouped by route and error with
// their count and first and last seen; the search box finds a task id in
// any state; a record shows when it failed last and when it parked; the
// received-time filter is a date-time picker whose local time goes into
// the link as RFC 3339 and filters the list; the charts draw where the
// admin API has a history, and the page says "no history" where it has
// none. (TestConsoleChartsOfAScriptedHour writes the docs' screenshots.)
func TestConsoleOverview(t *testing.T) {
	b := newBrowserTab(t)
	app := newAppStub(t)
	startCaddy(t, consoleParkGlobal, consoleSites(app))

	b.do(t, "overview, all well", chromedp.Navigate(consoleRoot),
		until(`(document.querySelector('#overall [data-state]')||{}).dataset?.state === 'ok'`))
	if text := evalJS[string](t, b, `document.querySelector('#overall').innerText`); !strings.Contains(text, "nothing needs a person") {
		t.Errorf("the overall state reads %q, want OK, nothing needs a person", text)
	}

	// One delivered, three parked.
	postConsolePingback(t, "8100", "TOKEN-8100", nil)
	waitForState(t, 5*time.Second, "2captcha", "8100", store.StateDelivered)
	app.SetStatus(http.StatusServiceUnavailable)
	for _, id := range []string{"8101", "8102", "8103"} {
		postConsolePingback(t, id, "TOKEN-"+id, nil)
	}
	for _, id := range []string{"8101", "8102", "8103"} {
		waitForState(t, 5*time.Second, "2captcha", id, store.StateParked)
	}
	b.do(t, "overview, results parked", chromedp.Navigate(consoleRoot),
		until(`document.querySelector('#overall [data-state="attention"] [data-need="parked"]')`),
		until(`document.querySelectorAll('#deadletters [data-group]').length === 1`))
	if text := evalJS[string](t, b, `document.querySelector('#overall').innerText`); !strings.Contains(text, "Needs a person") || !strings.Contains(text, "3 results parked") {
		t.Errorf("the overall state reads %q, want it to say 3 results parked need a person", text)
	}

	// The dead letters, grouped: the admin API's one group, on the page.
	var dl adminapi.DeadLetters
	if status, body := adminDo(t, http.MethodGet, "/pingback/deadletters", ""); status != http.StatusOK || json.Unmarshal(body, &dl) != nil || len(dl.Groups) != 1 {
		t.Fatalf("GET /pingback/deadletters: %d %s, want one group", status, body)
	}
	g := dl.Groups[0]
	route := "localhost:" + testHTTPPort + "/cb"
	if g.Route != route || g.Provider != "2captcha" || g.State != store.StateParked || g.Count != 3 || g.Error == "" ||
		g.FirstSeen.IsZero() || g.LastSeen.Before(g.FirstSeen) || dl.Scanned != 3 || dl.Truncated {
		t.Errorf("dead letters %+v, want 3 parked of 2captcha on %s with their error and times", dl, route)
	}
	group := evalJS[string](t, b, `document.querySelector('#deadletters [data-group]').innerText`)
	for _, want := range []string{"parked", "3", "2captcha → " + route, g.Error, "first seen", "last seen"} {
		if !strings.Contains(group, want) {
			t.Errorf("the dead-letter group reads %q, want %q in it", group, want)
		}
	}
	if n := evalJS[string](t, b, `document.querySelector('#deadletters [data-group] .count').textContent`); n != "3" {
		t.Errorf("the group counts %q, want 3", n)
	}

	// The history: charts where the admin API has it, "no history" where not.
	b.do(t, "history", until(`(document.querySelector('#charts')||{}).dataset?.history`))
	status, _ := adminDo(t, http.MethodGet, "/pingback/history", "")
	hasHistory := status != http.StatusNotFound
	if hasHistory != consoleHistoryMerged {
		t.Errorf("GET /pingback/history answers %d, yet consoleHistoryMerged is %v: set it to %v", status, consoleHistoryMerged, hasHistory)
	}
	if consoleHistoryMerged {
		if got := evalJS[string](t, b, `document.querySelector('#charts').dataset.history`); got != "shown" {
			t.Errorf("the history reads %q, want shown (%s)", got, evalJS[string](t, b, `document.querySelector('#charts').innerText`))
		}
		if n := evalJS[int](t, b, `document.querySelectorAll('#charts [data-chart] canvas').length`); n < 4 {
			t.Errorf("%d chart canvases, want one per chart (4)", n)
		}
	} else if got := evalJS[string](t, b, `document.querySelector('#charts').dataset.history + ' ' + document.querySelector('#charts').innerText`); got != "none No history: this Caddy keeps none." {
		t.Errorf("without a history the page reads %q, want it to say there is none", got)
	}

	// Pause and resume from the page, where the admin API has pauses.
	if status, _ := adminDo(t, http.MethodGet, "/pingback/pauses", ""); status == http.StatusNotFound {
		if hidden := evalJS[bool](t, b, `document.querySelector('#pause-form').hidden`); !hidden ||
			!strings.Contains(evalJS[string](t, b, `document.querySelector('#pauses').innerText`), "This Caddy cannot pause deliveries.") {
			t.Error("the admin API has no pauses, yet the page offers to pause")
		}
	} else {
		consolePauseAndResume(t, b)
	}

	// Search by task id: a delivered one and a parked one, from any view.
	for _, tc := range []struct{ id, state string }{{"8100", "delivered"}, {"8102", "parked"}, {"9999", ""}} {
		b.do(t, "search "+tc.id, chromedp.Navigate(consoleRoot+"?view=tasks"), until(`document.querySelector('#tasks')`))
		evalJS[string](t, b, `document.querySelector('#search input').value = `+jsString(tc.id))
		b.do(t, "find "+tc.id, chromedp.Click(chromedp.CSS(`#search button`)),
			until(`document.body.dataset.view === 'search' && document.querySelector('#found') && document.querySelector('#found').childElementCount > 0`))
		if tc.state == "" {
			if text := evalJS[string](t, b, `document.querySelector('#found').innerText`); !strings.Contains(text, "No stored result or tracked task has the id 9999") {
				t.Errorf("searching an unknown id reads %q", text)
			}
			continue
		}
		if got := evalJS[string](t, b, `(document.querySelector('#found [data-key="2captcha:`+tc.id+`"] .state')||{}).textContent`); got != tc.state {
			t.Errorf("searching %s finds it %q, want %s", tc.id, got, tc.state)
		}
		card := `#found [data-key="2captcha:` + tc.id + `"]`
		if n := evalJS[int](t, b, `document.querySelectorAll('`+card+` [data-field="failed-last"], `+card+` [data-field="parked-at"]').length`); tc.state == "parked" && n != 2 {
			t.Errorf("the parked card reads %q, want when it failed last and when it parked", evalJS[string](t, b, `document.querySelector('`+card+`').innerText`))
		}
	}

	// A parked record: when it failed last and when it parked.
	b.do(t, "record", chromedp.Navigate(consoleRoot+"?view=record&provider=2captcha&id=8101"),
		until(`document.querySelector('#record [data-field="parked-at"]')`))
	rec := getRecord(t, "2captcha", "8101")
	last := rec.History[len(rec.History)-1]
	wantAt := last.EndedAt.UTC().Format("2006-01-02 15:04:05Z")
	for _, f := range []string{"failed-last", "parked-at"} {
		if got := evalJS[string](t, b, `document.querySelector('#record [data-field="`+f+`"]').innerText`); !strings.HasPrefix(got, wantAt) {
			t.Errorf("the record's %s reads %q, want the end of its last attempt, %s", f, got, wantAt)
		}
	}
	if text := evalJS[string](t, b, `document.querySelector('#record').innerText`); strings.Contains(text, "undefined") || strings.Contains(text, "[object") {
		t.Errorf("the record reads %q: a value rendered as undefined or [object ...]", text)
	}

	// The received-time filter: a date-time picker, its local time in the
	// link as RFC 3339.
	b.do(t, "time filter", chromedp.Navigate(consoleRoot+"?view=records&state=delivered&received_after=2020-01-02T03:04:05Z"),
		until(`document.querySelector('#records [data-key="2captcha:8100"]')`))
	if typ := evalJS[string](t, b, `document.querySelector('input[name="received_after"]').type`); typ != "datetime-local" {
		t.Errorf("the received-after box is %q, want a datetime-local picker", typ)
	}
	want := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if got := evalJS[string](t, b, `new Date(document.querySelector('input[name="received_after"]').value).toISOString()`); got != want.Format("2006-01-02T15:04:05.000Z") {
		t.Errorf("the picker shows %s, want the link's time %s", got, want)
	}
	for _, tc := range []struct {
		name   string
		offset time.Duration
		found  bool
	}{{"an hour ahead", time.Hour, false}, {"an hour ago", -time.Hour, true}} {
		evalJS[string](t, b, `(() => { const d = new Date(Date.now() + `+jsNumber(tc.offset.Milliseconds())+`);
			const pad = (n) => String(n).padStart(2, '0');
			return document.querySelector('input[name="received_after"]').value = d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) +
				'T' + pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds()); })()`)
		ready := `document.querySelector('#records').innerText.includes('No stored result matches')`
		if tc.found {
			ready = `document.querySelector('#records [data-key="2captcha:8100"]')`
		}
		b.do(t, "filter "+tc.name, chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)), until(ready))
		q, err := url.ParseQuery(strings.TrimPrefix(evalJS[string](t, b, `location.search`), "?"))
		if err != nil {
			t.Fatal(err)
		}
		after, err := time.Parse(time.RFC3339, q.Get("received_after"))
		if err != nil || after.Location() != time.UTC || after.Sub(time.Now().Add(tc.offset)).Abs() > 5*time.Second {
			t.Errorf("filter %s: the link says received_after=%q (%v), want RFC 3339 in UTC, %s from now", tc.name, q.Get("received_after"), err, tc.offset)
		}
	}
}

// consolePauseAndResume pauses 2captcha from the overview's form, with a
// reason and a time it resumes by itself, and resumes it with its button:
// the admin API holds the pause as the console's, and the overall state
// names it while it holds.
func consolePauseAndResume(t *testing.T, b *browserTab) {
	t.Helper()
	b.do(t, "pause form", chromedp.Navigate(consoleRoot),
		until(`!document.querySelector('#pause-form').hidden && document.querySelector('#pause-form option[value="2captcha"]')`))
	resumeAt := time.Now().Add(time.Hour)
	evalJS[bool](t, b, `(() => { const f = document.querySelector('#pause-form');
		f.elements.provider.value = '2captcha'; f.elements.reason.value = 'deploy';
		const d = new Date(Date.now() + 3600 * 1000); const pad = (n) => String(n).padStart(2, '0');
		f.elements.until.value = d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + 'T' + pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
		return true; })()`)
	b.do(t, "pause", chromedp.Click(chromedp.CSS(`#pause-form button[type="submit"]`)),
		until(`document.querySelector('[data-paused="2captcha"]') && document.querySelector('#overall [data-need="pause"]')`))
	var pauses struct {
		Pauses []struct {
			Provider, Reason, By string
			Until                *time.Time
		}
	}
	if status, body := adminDo(t, http.MethodGet, "/pingback/pauses", ""); status != http.StatusOK || json.Unmarshal(body, &pauses) != nil ||
		len(pauses.Pauses) != 1 || pauses.Pauses[0].Provider != "2captcha" || pauses.Pauses[0].Reason != "deploy" || pauses.Pauses[0].By != "console" ||
		pauses.Pauses[0].Until == nil || pauses.Pauses[0].Until.Sub(resumeAt).Abs() > 5*time.Second {
		t.Errorf("after the console paused 2captcha: %d %s, want its pause by console, reason deploy, until in an hour", status, body)
	}
	if text := evalJS[string](t, b, `document.querySelector('#overall').innerText`); !strings.Contains(text, "Deliveries of 2captcha paused") || !strings.Contains(text, "(deploy)") {
		t.Errorf("the overall state reads %q, want the pause of 2captcha and its reason", text)
	}
	b.do(t, "resume", chromedp.Click(chromedp.CSS(`[data-paused="2captcha"] [data-action="resume"]`)),
		until(`document.querySelector('#pauses') && !document.querySelector('[data-paused]') && !document.querySelector('#overall [data-need="pause"]')`))
	if status, body := adminDo(t, http.MethodGet, "/pingback/pauses", ""); status != http.StatusOK || json.Unmarshal(body, &pauses) != nil || len(pauses.Pauses) != 0 {
		t.Errorf("after the console resumed 2captcha: %d %s, want no pause", status, body)
	}
}

// jsString quotes s as a JavaScript string.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// jsNumber writes n as a JavaScript number.
func jsNumber(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestConsoleOverviewShapes drives the overview in Chromium with the
// parts of GET /pingback/status that pauses, route health and
// notifications add, rewritten in the tab in the shapes the admin API
// answers: the overall state names the failing route and the pause; each
// route shows its last success, since when it fails and its provider's
// pause with a Resume button; the pauses and the recent notifications are
// listed; every value renders as text.
func TestConsoleOverviewShapes(t *testing.T) {
	b := newBrowserTab(t)
	app := newAppStub(t)
	startCaddy(t, "", consoleSites(app))

	now := time.Now().UTC().Truncate(time.Second)
	since := now.Add(-12 * time.Minute)
	evil := "app.example/" + consoleXSS
	s := &statusRoutes{routes: map[string]adminapi.RouteStatus{}, more: map[string]any{
		"records": map[string]map[string]int64{"2captcha": {"delivered": 4, "expired": 2}},
		"pauses": []map[string]any{
			{"provider": "2captcha", "reason": "deploy " + consoleXSS, "since": since, "until": nil, "by": "console"},
		},
		"route_health": map[string]map[string]any{
			"app.example/cb": {"provider": "2captcha", "last_success": now.Add(-time.Hour), "failing_since": since, "failures": 7},
			evil:             {"provider": "capsolver", "last_success": now.Add(-time.Minute), "failing_since": nil, "failures": 0},
		},
		"notifications": []map[string]any{
			{"event": "pingback_route_failing", "provider": "2captcha", "count": 3, "first_at": since, "last_at": now},
			{"event": "pingback_provider_paused", "provider": "2captcha", "count": 1, "first_at": since, "last_at": since},
		},
	}}
	s.intercept(t, b)
	b.do(t, "overview", chromedp.Navigate(consoleRoot),
		until(`document.querySelectorAll('[data-route-health]').length === 2`))

	overall := evalJS[string](t, b, `document.querySelector('#overall').innerText`)
	for _, want := range []string{"Needs a person", "2 results expired", "Route app.example/cb failing since " + since.Format("2006-01-02 15:04:05Z"),
		"Deliveries of 2captcha paused since " + since.Format("2006-01-02 15:04:05Z"), "by console", "until resumed"} {
		if !strings.Contains(overall, want) {
			t.Errorf("the overall state reads %q, want %q in it", overall, want)
		}
	}
	route := func(name string) string {
		return evalJS[string](t, b, `[...document.querySelectorAll('[data-route-health]')].find((e) => e.dataset.routeHealth === `+jsString(name)+`).innerText`)
	}
	for _, tc := range []struct{ route, want string }{
		{"app.example/cb", "last success\n" + now.Add(-time.Hour).Format("2006-01-02 15:04:05Z")},
		{"app.example/cb", "failing since\n" + since.Format("2006-01-02 15:04:05Z")},
		{"app.example/cb", "failures in a row\n7"},
		{"app.example/cb", "deliveries\npaused since"},
		{evil, "failing since\nnot failing"},
		{evil, "deliveries\nrunning"},
	} {
		if got := route(tc.route); !strings.Contains(got, tc.want) {
			t.Errorf("route %s reads %q, want %q in it", tc.route, got, tc.want)
		}
	}
	if n := evalJS[int](t, b, `document.querySelectorAll('[data-route-health="app.example/cb"] [data-action="resume"], [data-paused="2captcha"] [data-action="resume"], [data-provider="2captcha"] [data-action="resume"]').length`); n != 3 {
		t.Errorf("%d Resume buttons for the paused 2captcha, want one on its route, its pause and its provider", n)
	}
	if n := evalJS[int](t, b, `document.querySelectorAll('[data-route-health] [data-action="pause"][data-pause="capsolver"]').length`); n != 1 {
		t.Errorf("%d Pause buttons on the running capsolver route, want 1", n)
	}
	if hidden := evalJS[bool](t, b, `document.querySelector('#pause-form').hidden`); hidden {
		t.Error("the status has pauses, yet the pause form is hidden")
	}
	if typ := evalJS[string](t, b, `document.querySelector('#pause-form input[name="until"]').type`); typ != "datetime-local" {
		t.Errorf("the pause's resume time is a %q box, want a datetime-local picker", typ)
	}
	notes := evalJS[string](t, b, `document.querySelector('#notifications').innerText`)
	if !strings.Contains(notes, "pingback_route_failing 2captcha ×3") || !strings.Contains(notes, "pingback_provider_paused 2captcha") {
		t.Errorf("the notifications read %q, want both, the first with its count", notes)
	}
	if got := evalJS[string](t, b, `document.querySelector('[data-route-health] h3').textContent`); got != evil {
		t.Errorf("the route %q renders as %q, want it as text", evil, got)
	}
	if n := evalJS[int](t, b, `document.querySelectorAll('main img, main script').length`); n != 0 || evalJS[bool](t, b, `window.__xss !== undefined`) {
		t.Errorf("a value became markup: %d img or script elements", n)
	}
	if text := evalJS[string](t, b, `document.querySelector('main').innerText`); strings.Contains(text, "undefined") || strings.Contains(text, "[object") || strings.Contains(text, "null") {
		t.Errorf("the overview reads %q: a value rendered as undefined, null or [object ...]", text)
	}

	b.do(t, "phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulateScale(2)),
		chromedp.Navigate(consoleRoot), until(`document.querySelectorAll('[data-route-health]').length === 2`))
	noHorizontalScroll(t, b, "overview with pauses, routes and notifications")
}

// answerRule rewrites the answers of the console's API requests whose URL
// contains path: rewrite gets Caddy's status and body and returns what
// the page gets.
type answerRule struct {
	path    string
	rewrite func(status int, body []byte) (int, []byte)
}

// rewriteAnswers rewrites, in a browser tab, the answers of the console's
// API requests as rules say (the first rule whose path the URL contains),
// so that the page's code and its requests are the real ones. It stands
// in for what another part's admin route answers. Call it once per tab.
func rewriteAnswers(t *testing.T, b *browserTab, rules ...answerRule) {
	t.Helper()
	var mu sync.Mutex
	var errs []string
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range errs {
			t.Errorf("rewriting answers: %s", e)
		}
	})
	var patterns []*fetch.RequestPattern
	for _, r := range rules {
		patterns = append(patterns, &fetch.RequestPattern{URLPattern: "*" + r.path + "*", RequestStage: fetch.RequestStageResponse})
	}
	b.do(t, "intercepting answers", func(ctx context.Context, tgt *chromedp.Target) (chromedp.Void, error) {
		paused := cdp.Events(b.ctx, tgt, fetch.RequestPaused)
		if _, err := cdp.Call(ctx, tgt, fetch.Enable, fetch.EnableParams{Patterns: patterns}); err != nil {
			return chromedp.Void{}, err
		}
		go func() {
			for ev, err := range paused {
				if err != nil {
					return
				}
				go func() {
					body, err := cdp.Call(b.ctx, tgt, fetch.GetResponseBody, fetch.GetResponseBodyParams{RequestID: ev.RequestID})
					if err == nil {
						status, out := int(ev.ResponseStatusCode), body.Body
						for _, r := range rules {
							if strings.Contains(ev.Request.URL, r.path) {
								status, out = r.rewrite(status, out)
								break
							}
						}
						_, err = cdp.Call(b.ctx, tgt, fetch.FulfillRequest, fetch.FulfillRequestParams{RequestID: ev.RequestID, ResponseCode: int64(status),
							ResponseHeaders: []*fetch.HeaderEntry{{Name: "Content-Type", Value: "application/json"}}, Body: out})
					}
					if err != nil && b.ctx.Err() == nil {
						mu.Lock()
						errs = append(errs, err.Error())
						mu.Unlock()
					}
				}()
			}
		}()
		return chromedp.Void{}, nil
	})
}

// TestConsoleChartsAndRecordFields drives the console in Chromium with
// GET /pingback/history answered in its documented shape and a record
// carrying held, payload_erased and expired_reason: the four charts draw
// (uPlot, under the console's Content-Security-Policy, with no exception),
// a range of 6 h asks the API for 6 h, and the record says it is held, its
// payload erased and why it expired.
func TestConsoleChartsAndRecordFields(t *testing.T) {
	b := newBrowserTab(t)
	app := newAppStub(t)
	startCaddy(t, "", consoleSites(app))
	postConsolePingback(t, "8200", "TOKEN-8200", nil)
	waitForState(t, 5*time.Second, "2captcha", "8200", store.StateDelivered)

	history := func(int, []byte) (int, []byte) {
		minute := time.Now().UTC().Truncate(time.Minute)
		var points []map[string]any
		for i := 5; i >= 0; i-- {
			points = append(points, map[string]any{
				"minute":     minute.Add(-time.Duration(i) * time.Minute),
				"received":   map[string]int{"stored": 10 + i, "duplicate": i},
				"deliveries": map[string]int{"delivered": 9 + i, "failed": i % 2},
				"backlog":    map[string]int{"failed": i, "parked": 1},
				"delay_ms":   map[string]any{"count": 9, "p50": 12.5, "p95": 80},
				"age_ms":     map[string]any{"count": 9, "p50": 20, "p95": 90},
			})
		}
		out, _ := json.Marshal(map[string]any{"from": minute.Add(-5 * time.Minute), "to": minute, "step_seconds": 60, "points": points})
		return http.StatusOK, out
	}
	record := func(status int, body []byte) (int, []byte) {
		var rec map[string]any
		if json.Unmarshal(body, &rec) != nil {
			return status, body
		}
		rec["held"], rec["payload_erased"], rec["expired_reason"], rec["state"] = true, true, "max_age", "expired"
		out, _ := json.Marshal(rec)
		return status, out
	}
	rewriteAnswers(t, b, answerRule{"/api/history", history}, answerRule{"/api/records/2captcha/8200", record})
	b.do(t, "overview with history", chromedp.Navigate(consoleRoot),
		until(`(document.querySelector('#charts')||{}).dataset?.history === 'shown'`))
	if n := evalJS[int](t, b, `document.querySelectorAll('#charts [data-chart] canvas').length`); n != 4 {
		t.Errorf("%d chart canvases, want 4 (received, deliveries, backlog, delay)", n)
	}
	legend := evalJS[string](t, b, `document.querySelector('#charts').innerText`)
	for _, want := range []string{"stored", "duplicate", "delivered", "parked", "p50", "p95"} {
		if !strings.Contains(legend, want) {
			t.Errorf("the charts read %q, want the series %q", legend, want)
		}
	}
	b.screenshot(t, "charts.png")
	// The range: 6 h asks for 6 h.
	evalJS[bool](t, b, `(() => { const s = document.querySelector('#range'); s.value = '21600'; return s.dispatchEvent(new Event('change')); })()`)
	b.do(t, "6 h", until(`performance.getEntriesByType('resource').some((e) => { const u = new URL(e.name);
		return u.pathname.endsWith('/api/history') && (new Date(u.searchParams.get('to')) - new Date(u.searchParams.get('from'))) === 6 * 3600 * 1000; })`))

	b.do(t, "phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulateScale(2)),
		chromedp.Navigate(consoleRoot), until(`document.querySelectorAll('#charts [data-chart] canvas').length === 4`))
	noHorizontalScroll(t, b, "overview with charts")

	b.do(t, "record", chromedp.Navigate(consoleRoot+"?view=record&provider=2captcha&id=8200"),
		until(`document.querySelector('#record [data-field="expired-reason"]')`))
	for _, tc := range []struct{ field, want string }{
		{"held", "yes: its provider is paused"},
		{"payload-erased", "erased"},
		{"expired-reason", "max_age"},
	} {
		if got := evalJS[string](t, b, `(document.querySelector('#record [data-field="`+tc.field+`"]')||{}).textContent`); !strings.HasPrefix(got, tc.want) {
			t.Errorf("the record's %s reads %q, want %q", tc.field, got, tc.want)
		}
	}
	if got := evalJS[string](t, b, `document.querySelector('#record .state').textContent`); got != "expired" {
		t.Errorf("the record's state reads %q, want expired", got)
	}
}
