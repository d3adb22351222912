package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// drillResult is one row of the drill's report (the --json "scenarios"
// element).
type drillResult struct {
	ID       string  `json:"id"`
	Route    string  `json:"route"`
	Provider string  `json:"provider"`
	Verdict  string  `json:"verdict"` // pass or fail
	Seconds  float64 `json:"seconds"`
	Measures string  `json:"measures"`
	Expected string  `json:"expected"`
	Seen     string  `json:"seen"`
}

// The scenario ids (pinned).
const (
	scDuplicate      = "duplicate"
	scConcurrent     = "duplicate_concurrent"
	scAppDown        = "app_down"
	scApp5xx         = "app_5xx"
	scSlowApp        = "slow_app"
	scDropped        = "dropped_pingback"
	scSigkill        = "sigkill"
	scProviderOutage = "provider_outage"
	scRace           = "race"
	scForged         = "forged_pingback"
)

// drillSettle is how long the drill keeps watching after a delivery for a
// second one.
const drillSettle = 500 * time.Millisecond

// drillRun holds the running drill's parts.
type drillRun struct {
	ctx      context.Context
	sb       *sandbox
	child    *drillChild
	app      *standin
	sims     map[string]*drillSim
	client   *http.Client
	progress func(drillResult)
	results  []drillResult
	nextID   atomic.Int64
	broken   map[*drillRoute]string // routes that do not reach pingback: why
}

func (d *drillRun) add(r drillResult) {
	d.results = append(d.results, r)
	if d.progress != nil {
		d.progress(r)
	}
}

// newID returns a task id in the provider's format, unique in this drill.
func (d *drillRun) newID(provider string) string {
	n := d.nextID.Add(1)
	if provider == "capsolver" {
		return fmt.Sprintf("d0d0d0d0-0000-4000-8000-%012d", n)
	}
	return strconv.FormatInt(time.Now().Unix()*1000+n, 10)
}

// send delivers a pingback to a route as the provider would.
func (d *drillRun) send(r *drillRoute, id, code string) (int, string, error) {
	return d.sendToken(r, "", id, code)
}

// sendToken is send with a pingback token in the URL's query (none when
// token is ""), as the provider calls the pingback URL pingback_track gave
// it.
func (d *drillRun) sendToken(r *drillRoute, token, id, code string) (int, string, error) {
	var req *http.Request
	var err error
	target := r.URL()
	if token != "" {
		target += "?" + protocol.TokenParam + "=" + token
	}
	switch p, _ := protocol.Lookup(r.Provider); {
	case p.LegacyCallback == protocol.FormGET:
		q := url.Values{"id": {id}, "code": {code}}
		if token != "" {
			q.Set(protocol.TokenParam, token)
		}
		req, err = http.NewRequestWithContext(d.ctx, http.MethodGet, r.URL()+"?"+q.Encode(), nil)
	case p.Has(protocol.Legacy):
		req, err = http.NewRequestWithContext(d.ctx, http.MethodPost, target, strings.NewReader(url.Values{"id": {id}, "code": {code}}.Encode()))
		if req != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	default:
		var tid any = json.Number(id)
		if !p.NumericTaskID {
			tid = id
		}
		body, _ := json.Marshal(map[string]any{"errorId": 0, "status": "ready", "taskId": tid,
			"solution": map[string]string{"gRecaptchaResponse": code}})
		req, err = http.NewRequestWithContext(d.ctx, http.MethodPost, target, strings.NewReader(string(body)))
		if req != nil {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	if err != nil {
		return 0, "", err
	}
	req.Host = r.Host
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// waitFor polls cond every 20ms until it holds, the time is up or the
// drill is interrupted.
func (d *drillRun) waitFor(within time.Duration, cond func() bool) bool {
	end := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) || d.ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pause waits d (a scenario's fault window), or until interrupted.
func (d *drillRun) pause(t time.Duration) {
	select {
	case <-time.After(t):
	case <-d.ctx.Done():
	}
}

func key(provider, id string) string { return provider + ":" + id }

// delivered waits until every key was accepted by the stand-in, then for
// drillSettle more, and returns the counts and the latest first arrival.
func (d *drillRun) delivered(within time.Duration, keys ...string) (counts []int, last time.Time, all bool) {
	all = d.waitFor(within, func() bool {
		for _, k := range keys {
			if n, _ := d.app.count(k); n == 0 {
				return false
			}
		}
		return true
	})
	if all {
		d.pause(drillSettle)
	}
	for _, k := range keys {
		n, t := d.app.count(k)
		counts = append(counts, n)
		if t.After(last) {
			last = t
		}
	}
	return counts, last, all
}

func allOnce(counts []int) bool {
	for _, n := range counts {
		if n != 1 {
			return false
		}
	}
	return len(counts) > 0
}

func countsText(counts []int) string {
	parts := make([]string, len(counts))
	for i, n := range counts {
		parts[i] = strconv.Itoa(n)
	}
	return "deliveries the app accepted, per result: " + strings.Join(parts, ", ")
}

func verdict(ok bool) string {
	if ok {
		return "pass"
	}
	return "fail"
}

func secs(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// deliveryWait bounds the wait for a replayed delivery.
func (d *drillRun) deliveryWait() time.Duration {
	return d.sb.BackoffMax + 10*time.Second
}

// routeScenarios runs the per-route scenarios other than sigkill.
func (d *drillRun) routeScenarios(r *drillRoute) {
	d.duplicate(r)
	if why, ok := d.broken[r]; ok {
		for _, id := range []string{scConcurrent, scAppDown, scApp5xx, scSlowApp} {
			d.add(drillResult{ID: id, Route: r.Name(), Provider: r.Provider, Verdict: "fail",
				Measures: "not run", Expected: "the route reaches its pingback handler", Seen: why})
		}
		return
	}
	d.concurrent(r)
	d.appDown(r, scAppDown, standinRefused, "connection refused")
	d.appDown(r, scApp5xx, standin503, "503")
	d.slowApp(r)
}

func (d *drillRun) duplicate(r *drillRoute) {
	id := d.newID(r.Provider)
	start := time.Now()
	s1, b1, err1 := d.send(r, id, "DRILL-"+id)
	s2, _, err2 := d.send(r, id, "DRILL-"+id)
	counts, last, _ := d.delivered(10*time.Second, key(r.Provider, id))
	res := drillResult{ID: scDuplicate, Route: r.Name(), Provider: r.Provider, Measures: "first send to delivery",
		Expected: "both sends answered 200, the app receives the result once"}
	switch {
	case err1 != nil || err2 != nil:
		res.Seen = fmt.Sprintf("send failed: %v", errors.Join(err1, err2))
	case counts[0] == 0:
		stored, _ := d.child.stored(r.Provider, id)
		if !stored {
			why := fmt.Sprintf("route %s (server %s): the pingback was answered %d %q but never stored: a handler before pingback answers it", r.Name(), r.Server, s1, b1)
			if len(r.Before) > 0 {
				why += " (handlers before it: " + strings.Join(r.Before, ", ") + ")"
			}
			res.Seen = why
			d.broken[r] = why
		} else {
			why := fmt.Sprintf("route %s: answers %d and %d, the result stored, but the app accepted no delivery within 10s (%d requests reached it): the route's upstream does not take pingbacks", r.Name(), s1, s2, d.app.requests(key(r.Provider, id)))
			res.Seen = why
			d.broken[r] = why // the other scenarios would only time out
		}
	default:
		res.Seen = fmt.Sprintf("answers %d and %d; %s", s1, s2, countsText(counts))
	}
	res.Verdict = verdict(err1 == nil && err2 == nil && s1 == 200 && s2 == 200 && allOnce(counts))
	if counts[0] > 0 {
		res.Seconds = secs(last.Sub(start))
	}
	d.add(res)
}

func (d *drillRun) concurrent(r *drillRoute) {
	id := d.newID(r.Provider)
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for range 20 {
		wg.Go(func() {
			s, _, err := d.send(r, id, "DRILL-"+id)
			if err != nil {
				s = 0
			}
			mu.Lock()
			statuses[s]++
			mu.Unlock()
		})
	}
	wg.Wait()
	counts, last, _ := d.delivered(10*time.Second, key(r.Provider, id))
	ok := statuses[200] == 20 && allOnce(counts)
	res := drillResult{ID: scConcurrent, Route: r.Name(), Provider: r.Provider, Verdict: verdict(ok),
		Measures: "first send to delivery", Expected: "20 concurrent sends all answered 200, the app receives the result once",
		Seen: fmt.Sprintf("answers %s; %s", statusText(statuses), countsText(counts))}
	if counts[0] > 0 {
		res.Seconds = secs(last.Sub(start))
	}
	d.add(res)
}

func statusText(m map[int]int) string {
	var parts []string
	for s := range 600 {
		if n := m[s]; n > 0 {
			label := strconv.Itoa(s)
			if s == 0 {
				label = "no answer"
			}
			parts = append(parts, fmt.Sprintf("%d× %s", n, label))
		}
	}
	return strings.Join(parts, ", ")
}

// appDown takes the app down (mode), sends three pingbacks, brings it
// back and times recovery to delivery.
func (d *drillRun) appDown(r *drillRoute, id string, mode standinMode, what string) {
	res := drillResult{ID: id, Route: r.Name(), Provider: r.Provider, Measures: "recovery to delivery",
		Expected: fmt.Sprintf("3 results sent while the app is down (%s) answered 200, each delivered once within %s of recovery (replay backoff_max)", what, d.sb.BackoffMax.Round(time.Millisecond))}
	if err := d.app.setMode(mode, 0); err != nil {
		res.Verdict, res.Seen = "fail", "cannot take the stand-in down: "+err.Error()
		d.add(res)
		return
	}
	var keys []string
	statuses := map[int]int{}
	for range 3 {
		tid := d.newID(r.Provider)
		s, _, err := d.send(r, tid, "DRILL-"+tid)
		if err != nil {
			s = 0
		}
		statuses[s]++
		keys = append(keys, key(r.Provider, tid))
	}
	down := max(time.Second, 4*time.Duration(float64(d.sb.defaults.BackoffMin)*d.sb.Scale))
	d.pause(down)
	_ = d.app.setMode(standinUp, 0)
	back := time.Now()
	counts, last, all := d.delivered(d.deliveryWait(), keys...)
	took := last.Sub(back)
	ok := statuses[200] == 3 && all && allOnce(counts) && took <= d.sb.BackoffMax+time.Second
	res.Verdict = verdict(ok)
	res.Seen = fmt.Sprintf("answers %s; %s", statusText(statuses), countsText(counts))
	if all {
		res.Seconds = secs(took)
		res.Seen += fmt.Sprintf(", the last %s after recovery", took.Round(time.Millisecond))
	}
	d.add(res)
}

func (d *drillRun) slowApp(r *drillRoute) {
	delay := r.AckTime + time.Second
	limit := r.AckTime + max(250*time.Millisecond, r.AckTime/4)
	res := drillResult{ID: scSlowApp, Route: r.Name(), Provider: r.Provider, Measures: "send to the provider's answer",
		Expected: fmt.Sprintf("with the app taking %s, the provider is answered 200 within %s (ack_timeout %s), the app receives the result once", delay, limit, r.AckTime)}
	_ = d.app.setMode(standinSlow, delay)
	id := d.newID(r.Provider)
	start := time.Now()
	s, _, err := d.send(r, id, "DRILL-"+id)
	answered := time.Since(start)
	counts, _, _ := d.delivered(delay+10*time.Second, key(r.Provider, id))
	_ = d.app.setMode(standinUp, 0)
	res.Seconds = secs(answered)
	res.Verdict = verdict(err == nil && s == 200 && answered <= limit && allOnce(counts))
	res.Seen = fmt.Sprintf("answered %d after %s; %s", s, answered.Round(time.Millisecond), countsText(counts))
	if err != nil {
		res.Seen = "send failed: " + err.Error()
	}
	d.add(res)
}

// sigkill acknowledges pingbacks with the app down, kills the child with
// SIGKILL, restarts it with the app up, and checks each result arrives
// once: one kill for every route.
func (d *drillRun) sigkill() error {
	_ = d.app.setMode(standin503, 0)
	type sent struct {
		keys     []string
		statuses map[int]int
	}
	per := map[*drillRoute]*sent{}
	for _, r := range d.sb.Routes {
		if _, ok := d.broken[r]; ok {
			continue
		}
		s := &sent{statuses: map[int]int{}}
		for range 2 {
			id := d.newID(r.Provider)
			st, _, err := d.send(r, id, "DRILL-"+id)
			if err != nil {
				st = 0
			}
			s.statuses[st]++
			s.keys = append(s.keys, key(r.Provider, id))
		}
		per[r] = s
	}
	d.child.kill()
	_ = d.app.setMode(standinUp, 0)
	restart := time.Now()
	if err := d.child.start(d.ctx); err != nil {
		return fmt.Errorf("restarting the sandbox after SIGKILL: %w", err)
	}
	for _, r := range d.sb.Routes {
		res := drillResult{ID: scSigkill, Route: r.Name(), Provider: r.Provider, Measures: "restart to delivery",
			Expected: "2 results acknowledged with the app down, Caddy killed (SIGKILL) and restarted: each delivered once"}
		s := per[r]
		if s == nil {
			res.Verdict, res.Seen = "fail", d.broken[r]
			d.add(res)
			continue
		}
		counts, last, all := d.delivered(d.deliveryWait(), s.keys...)
		res.Verdict = verdict(s.statuses[200] == 2 && all && allOnce(counts))
		res.Seen = fmt.Sprintf("answers %s; %s", statusText(s.statuses), countsText(counts))
		if all {
			res.Seconds = secs(last.Sub(restart))
		}
		d.add(res)
	}
	return nil
}

// submit creates a task at the provider's simulator and registers it with
// the sandbox's poller, as pingback_track does for the app's submissions.
func (d *drillRun) submit(p *drillPolled) (string, error) {
	base, host := d.sims[p.Provider].url, ""
	if p.Track != nil {
		base, host = "http://"+p.Track.Addr+p.Track.Base, p.Track.Host
	}
	do := func(method, u, contentType, body string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(d.ctx, method, u, strings.NewReader(body))
		if err != nil {
			return nil, err
		}
		if host != "" {
			req.Host = host
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		return d.client.Do(req)
	}
	var id, method string
	if p.API == protocol.Legacy {
		method = "userrecaptcha"
		q := url.Values{"key": {drillSimKey}, "method": {method}, "googlekey": {"drill"}, "pageurl": {"https://drill.example"}, "json": {"1"}}
		resp, err := do(http.MethodGet, base+"/in.php?"+q.Encode(), "", "")
		if err != nil {
			return "", err
		}
		var a struct {
			Status  int             `json:"status"`
			Request json.RawMessage `json:"request"`
		}
		err = json.NewDecoder(resp.Body).Decode(&a)
		_ = resp.Body.Close()
		if err != nil || a.Status != 1 {
			return "", fmt.Errorf("in.php (%s): %v %s", base, err, a.Request)
		}
		id = strings.Trim(string(a.Request), `"`)
	} else {
		method = "RecaptchaV2TaskProxyless"
		body := `{"clientKey":"` + drillSimKey + `","task":{"type":"` + method + `","websiteURL":"https://drill.example","websiteKey":"drill"}}`
		resp, err := do(http.MethodPost, base+"/createTask", "application/json", body)
		if err != nil {
			return "", err
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		tid, _, ok := protocol.ParseCreateTaskAnswer(b)
		if !ok {
			return "", fmt.Errorf("createTask (%s): %s", base, b)
		}
		id = tid
	}
	if p.Track != nil {
		return id, nil // tracked by the config's pingback_track, with its pingback_url
	}
	return id, d.child.registerTask(p.Provider, id, p.Route.pingbackURL(), string(p.API), method)
}

// pollWindow is the configured window from submission to a polled
// delivery: after plus interval, plus a poll tick and a second of slack.
func (d *drillRun) pollWindow() time.Duration {
	tick := Scaled(d.sb.Scale, time.Second, 100*time.Millisecond)
	return d.sb.FirstPoll + d.sb.Interval + tick + time.Second
}

// providerScenarios runs dropped_pingback, provider_outage and race for a
// polled provider.
func (d *drillRun) providerScenarios(p *drillPolled) {
	if p.Route == nil {
		for _, id := range p.scenarios() {
			d.add(drillResult{ID: id, Provider: p.Provider, Verdict: "fail", Measures: "not run",
				Expected: "a pingback route for the provider, to deliver polled results to",
				Seen:     "the config polls " + p.Provider + " but has no pingback route for it: polled results cannot be delivered"})
		}
		return
	}
	if why, ok := d.broken[p.Route]; ok {
		for _, id := range p.scenarios() {
			d.add(drillResult{ID: id, Route: p.Route.Name(), Provider: p.Provider, Verdict: "fail", Measures: "not run",
				Expected: "the route reaches its pingback handler", Seen: why})
		}
		return
	}
	d.dropped(p)
	d.outage(p)
	d.race(p)
	if p.Track != nil {
		d.forged(p)
	}
}

func (d *drillRun) dropped(p *drillPolled) {
	window := d.pollWindow()
	res := drillResult{ID: scDropped, Route: p.Route.Name(), Provider: p.Provider, Measures: "submission to delivery",
		Expected: fmt.Sprintf("every pingback dropped: 2 tracked tasks recovered by polling and delivered once within %s (after %s + interval %s)",
			window.Round(time.Millisecond), d.sb.FirstPoll.Round(time.Millisecond), d.sb.Interval.Round(time.Millisecond))}
	start := time.Now()
	var keys []string
	for range 2 {
		id, err := d.submit(p)
		if err != nil {
			res.Verdict, res.Seen = "fail", "submitting a task: "+err.Error()
			d.add(res)
			return
		}
		keys = append(keys, key(p.Provider, id))
	}
	counts, last, all := d.delivered(window+10*time.Second, keys...)
	took := last.Sub(start)
	res.Verdict = verdict(all && allOnce(counts) && took <= window)
	res.Seen = countsText(counts)
	if all {
		res.Seconds = secs(took)
		res.Seen += fmt.Sprintf(", the last %s after submission", took.Round(time.Millisecond))
	}
	d.add(res)
}

func (d *drillRun) outage(p *drillPolled) {
	sim := d.sims[p.Provider]
	floor := Scaled(d.sb.Scale, 5*time.Second, time.Second)
	window := 3 * floor
	bound := 1 + int(window/floor)
	res := drillResult{ID: scProviderOutage, Route: p.Route.Name(), Provider: p.Provider, Measures: "outage end to delivery",
		Expected: fmt.Sprintf("result endpoint answering HTML 503 for %s: at most %d result calls (back-off from %s), then the result delivered once",
			window, bound, floor)}
	_, before := sim.calls()
	sim.outage.Store(true)
	id, err := d.submit(p)
	if err != nil {
		sim.outage.Store(false)
		res.Verdict, res.Seen = "fail", "submitting a task: "+err.Error()
		d.add(res)
		return
	}
	if !d.waitFor(d.pollWindow()+5*time.Second, func() bool { _, n := sim.calls(); return n > before }) {
		sim.outage.Store(false)
		res.Verdict, res.Seen = "fail", "the poller never asked for the result"
		d.add(res)
		return
	}
	d.pause(window)
	_, during := sim.calls()
	during -= before
	sim.outage.Store(false)
	end := time.Now()
	counts, last, all := d.delivered(floor<<4+d.pollWindow(), key(p.Provider, id))
	took := last.Sub(end)
	res.Verdict = verdict(during <= bound && all && allOnce(counts))
	res.Seen = fmt.Sprintf("%d result calls during the outage; %s", during, countsText(counts))
	if all {
		res.Seconds = secs(took)
		res.Seen += fmt.Sprintf(" %s after it ended", took.Round(time.Millisecond))
	}
	d.add(res)
}

func (d *drillRun) race(p *drillPolled) {
	res := drillResult{ID: scRace, Route: p.Route.Name(), Provider: p.Provider, Measures: "submission to delivery",
		Expected: "the pingback sent when the poll is due: one delivery"}
	start := time.Now()
	id, err := d.submit(p)
	if err != nil {
		res.Verdict, res.Seen = "fail", "submitting a task: "+err.Error()
		d.add(res)
		return
	}
	code := "DRILL-" + id
	if t, ok := d.sims[p.Provider].sim.Task(id); ok && t.Code != "" {
		code = t.Code
	}
	d.pause(time.Until(start.Add(d.sb.FirstPoll)))
	s, _, err := d.sendToken(p.Route, d.token(p, id), id, code)
	counts, last, all := d.delivered(d.pollWindow()+5*time.Second, key(p.Provider, id))
	res.Verdict = verdict(err == nil && s == 200 && all && allOnce(counts))
	res.Seen = fmt.Sprintf("pingback answered %d; %s", s, countsText(counts))
	if err != nil {
		res.Seen = "send failed: " + err.Error()
	}
	if all {
		res.Seconds = secs(last.Sub(start))
	}
	d.add(res)
}

// scenarios are the provider scenarios run for p: forged_pingback only
// when its tasks go through pingback_track (and so carry tokens).
func (p *drillPolled) scenarios() []string {
	ids := []string{scDropped, scProviderOutage, scRace}
	if p.Track != nil {
		ids = append(ids, scForged)
	}
	return ids
}

// token is the pingback token pingback_track gave the provider for task
// id (in the pingback URL the simulator received), "" if none.
func (d *drillRun) token(p *drillPolled, id string) string {
	t, ok := d.sims[p.Provider].sim.Task(id)
	if !ok {
		return ""
	}
	_, q, _ := strings.Cut(t.Pingback, "?")
	tok, n := protocol.QueryToken(q)
	if n != 1 {
		return ""
	}
	return tok
}

// forged sends forged pingbacks for a task submitted through
// pingback_track, without its token and with a wrong one, as an attacker
// on the network who guessed the id would, then the provider's real
// pingback with its token: the forgeries are answered 200 and
// quarantined, never delivered; the real code is delivered once (by the
// real pingback, or by the poller if it came first).
func (d *drillRun) forged(p *drillPolled) {
	res := drillResult{ID: scForged, Route: p.Route.Name(), Provider: p.Provider, Measures: "real pingback to delivery",
		Expected: fmt.Sprintf("with verify %s: forged pingbacks (no token, a wrong one) for a tracked task answered 200, quarantined, never delivered; the real one, with its token, delivered once with its code", p.Route.Verify)}
	fail := func(seen string) {
		res.Verdict, res.Seen = "fail", seen
		d.add(res)
	}
	id, err := d.submit(p)
	if err != nil {
		fail("submitting a task: " + err.Error())
		return
	}
	tok := d.token(p, id)
	if tok == "" {
		fail("the provider was given a pingback URL without a " + protocol.TokenParam)
		return
	}
	k := key(p.Provider, id)
	forgedCode := "FORGED-" + id
	for _, t := range []string{"", strings.Repeat("0", len(tok))} {
		s, _, err := d.sendToken(p.Route, t, id, forgedCode)
		if err != nil || s != http.StatusOK {
			fail(fmt.Sprintf("forged pingback answered %d (%v), want 200", s, err))
			return
		}
	}
	rec, err := d.child.record(p.Provider, id)
	if err != nil || rec == nil {
		fail(fmt.Sprintf("the forged pingback is not stored (%v)", err))
		return
	}
	quarantined := rec.State == "quarantined"
	d.pause(drillSettle)
	if n, _ := d.app.count(k); n != 0 {
		fail(fmt.Sprintf("the app was sent %d deliveries of the forged pingback (stored as %s)", n, rec.State))
		return
	}
	code := "DRILL-" + id
	if t, ok := d.sims[p.Provider].sim.Task(id); ok && t.Code != "" {
		code = t.Code
	}
	start := time.Now()
	s, _, err := d.sendToken(p.Route, tok, id, code)
	counts, last, all := d.delivered(d.deliveryWait(), k)
	rec, rerr := d.child.record(p.Provider, id)
	// JSON providers store the canonical JSON of the solution: the codes
	// are inside it.
	realCode := rerr == nil && rec != nil && strings.Contains(rec.Code, code) && strings.Contains(rec.OtherCode, forgedCode)
	res.Verdict = verdict(err == nil && s == http.StatusOK && quarantined && all && allOnce(counts) && realCode)
	res.Seen = fmt.Sprintf("forgeries answered 200, stored %s; real pingback answered %d; %s", map[bool]string{true: "quarantined", false: "not quarantined"}[quarantined], s, countsText(counts))
	switch {
	case err != nil:
		res.Seen = "sending the real pingback failed: " + err.Error()
	case rerr != nil || rec == nil:
		res.Seen += fmt.Sprintf("; reading the record: %v", rerr)
	case !realCode:
		res.Seen += "; the stored code is not the real one (the forgery's kept as other_code)"
	}
	if all {
		res.Seconds = secs(last.Sub(start))
	}
	d.add(res)
}
