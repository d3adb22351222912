package pingback

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// The drain scenario of fair replays and Retry-After: a backlog that
// failed while the app was down, then an app that comes back able to take
// only a few requests at once, while live pingbacks keep arriving.
const (
	drainBacklog     = 3000                   // results received while the app is down
	drainDownFails   = 3                      // failures of every backlog result before the app comes back
	drainLiveEvery   = 200 * time.Millisecond // live pingbacks at 5/s
	drainLiveAtLeast = 100                    // live pingbacks sent at least (more while the backlog drains)
	drainAppCap      = 4                      // requests the app serves at once
	drainService     = 20 * time.Millisecond  // each one's service time
	drainDeadline    = 60 * time.Second       // from the app's return until every result is delivered
	drainLiveP99     = 5 * time.Second        // live delivery latency p99, from the provider's send
	// drainSlack is how much sooner than its Retry-After allows a request
	// may come and still count as honouring it. The app stamps a refusal
	// before it writes it, and the plugin can only start waiting once it
	// has read it, so an honest wait needs no slack from that; but the
	// plugin keeps due times as wall-clock times in its store (without
	// Go's monotonic reading) while the app compares monotonic readings,
	// so a wall-clock slew between the two, and the store's time
	// resolution, may shift a correct retry by a few milliseconds.
	drainSlack = 10 * time.Millisecond
)

// TestDrainIsFairAndHonoursRetryAfter: a backlog of 3,000 results failed
// while the app was down (each answered 200 to the provider); then the app
// comes back able to serve 4 requests at once, refusing the others with a
// Retry-After, and live pingbacks arrive at 5/s while the backlog drains.
// Every result must reach the app exactly once, live pingbacks must not
// wait behind the backlog (delivery p99 under 5 s from the provider's send,
// fewer than 5% refused even once), and no result may be retried sooner
// than the Retry-After of its refusal.
//
// The two time budgets (the drain deadline and the live p99) are what the
// test measures; under the race detector they stretch by testkit.Slowdown,
// like every wait, so that the race pass checks the rest (exactly once,
// Retry-After, the cap, fairness) with the detector watching the replay
// loop, while the plain pass holds the budgets as written.
func TestDrainIsFairAndHonoursRetryAfter(t *testing.T) {
	cases := []struct {
		name   string
		refuse testkit.Refusal
	}{
		{"429 with Retry-After 1", testkit.RetryAfterSeconds(http.StatusTooManyRequests, 1)},
		{"503 with a Retry-After HTTP-date", testkit.RetryAfterDate(http.StatusServiceUnavailable, time.Second)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { testDrain(t, tc.refuse) })
	}
}

// drainKey is what the app keys its records by: the task id the
// pingback carries.
func drainKey(r *http.Request) string { return r.URL.Query().Get("id") }

// drainBacklogID and drainLiveID are the task ids of the i-th backlog and
// live pingback.
func drainBacklogID(i int) string { return fmt.Sprint(100_000_000 + i) }
func drainLiveID(i int) string    { return fmt.Sprint(200_000_000 + i) }

// testDrain runs the scenario against an app that refuses above its cap
// with refuse: (a) the backlog is received while the app is down (503, no
// Retry-After) and fails drainDownFails times; (b) the app comes up and
// live pingbacks start at 5/s; (c) every result must be delivered within
// drainDeadline. The figures are logged before any assertion fails.
func testDrain(t *testing.T, refuse testkit.Refusal) {
	app := testkit.NewCappedApp(t, testkit.Capacity{
		Requests: drainAppCap, Service: drainService, Refuse: refuse, Key: drainKey,
	})
	app.SetDown(true)
	startDrainCaddy(t, app.URL)
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: 32},
		Timeout:   10 * time.Second,
	}
	t.Cleanup(client.CloseIdleConnections)

	// (a) The backlog, received while the app is down.
	backlog := make([]string, drainBacklog)
	for i := range backlog {
		backlog[i] = drainBacklogID(i)
	}
	sendBacklog(t, client, backlog)
	testkit.WaitFor(t, 60*time.Second, fmt.Sprintf("every backlog result to fail %d times", drainDownFails), func() bool {
		for _, id := range backlog {
			if app.Count(id) < drainDownFails {
				return false
			}
		}
		return true
	})

	// (b) The app comes back with its cap; live pingbacks start at once.
	upAt := app.SetDown(false)
	deadline := upAt.Add(testkit.Slowdown * drainDeadline)
	drained := func() bool {
		for _, id := range backlog {
			if app.Deliveries(id) == 0 {
				return false
			}
		}
		return true
	}
	live := sendLive(t, client, deadline, drained)

	// (c) Every result delivered, within the deadline.
	all := append(slices.Clone(backlog), live.ids...)
	var pending []string
	for {
		pending = pending[:0]
		for _, id := range all {
			if app.Deliveries(id) == 0 {
				pending = append(pending, id)
			}
		}
		if len(pending) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	f := drainFiguresOf(app, upAt, backlog, live)
	f.log(t)
	if len(pending) > 0 {
		t.Fatalf("%d of %d results not delivered %s after the app came back (e.g. %s: %d requests, the last answered %d)",
			len(pending), len(all), testkit.Slowdown*drainDeadline, pending[0], app.Count(pending[0]), lastStatus(app.Exchanges(pending[0])))
	}

	// What the app saw, result by result.
	if len(f.twice) > 0 {
		t.Errorf("%d results delivered (2xx) more than once, e.g. %s %d times", len(f.twice), f.twice[0], app.Deliveries(f.twice[0]))
	}
	if budget := testkit.Slowdown * drainLiveP99; f.p99 >= budget {
		t.Errorf("live delivery latency p99 %.2fs (p50 %.2fs, max %.2fs), want under %s", f.p99.Seconds(), f.p50.Seconds(), f.max.Seconds(), budget)
	}
	if f.liveRefused*20 >= len(live.ids) {
		t.Errorf("%d of %d live pingbacks (%.1f%%) refused at least once, want under 5%%",
			f.liveRefused, len(live.ids), 100*float64(f.liveRefused)/float64(len(live.ids)))
	}
	if len(f.early) > 0 {
		e := f.early[0]
		t.Errorf("%d of %d refusals were followed by a request sooner than their Retry-After allowed: e.g. %s refused at %s (%s), retried %dms after, %dms before the time it was given",
			len(f.early), f.refusals, e.id, e.refused.Answered.Format("15:04:05.000"), drainWhich(e.id),
			e.next.Arrived.Sub(e.refused.Answered).Milliseconds(), e.refused.NotBefore.Sub(e.next.Arrived).Milliseconds())
	}
	if peak := app.PeakInflight(); peak > drainAppCap {
		t.Errorf("the app served %d requests at once, over its cap of %d (the test app is broken)", peak, drainAppCap)
	}

	// The plugin agrees: every record delivered in its store.
	testkit.WaitFor(t, 10*time.Second, "every record delivered in the store", func() bool {
		for len(all) > 0 && getRecord(t, "captchaai", all[0]).State == store.StateDelivered {
			all = all[1:]
		}
		return len(all) == 0
	})
}

// drainWhich says whether a task id is of the backlog or live.
func drainWhich(id string) string {
	if strings.HasPrefix(id, "2") {
		return "live"
	}
	return "backlog"
}

// lastStatus is the status of the last answered exchange, 0 if none.
func lastStatus(ex []testkit.Exchange) int {
	for i := len(ex) - 1; i >= 0; i-- {
		if ex[i].Status != 0 {
			return ex[i].Status
		}
	}
	return 0
}

// drainPingback sends the captchaai pingback of task id and reports what
// went wrong, or "" if the provider got 200 "OK".
func drainPingback(client *http.Client, id string) string {
	resp, err := client.Get(testBase + "/cb?id=" + id + "&code=03AGdBq2" + id)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || string(body) != "OK" {
		return fmt.Sprintf("%d %q", resp.StatusCode, body)
	}
	return ""
}

// sendBacklog sends the pingbacks of ids from 16 senders at once and fails
// t unless every one was answered 200 "OK".
func sendBacklog(t *testing.T, client *http.Client, ids []string) {
	t.Helper()
	work := make(chan string)
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for id := range work {
				if what := drainPingback(client, id); what != "" {
					mu.Lock()
					bad = append(bad, id+": "+what)
					mu.Unlock()
				}
			}
		})
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of %d backlog pingbacks not answered 200 \"OK\" while the app was down, e.g. %s", len(bad), len(ids), bad[0])
	}
}

// liveTraffic is the live pingbacks sent during the drain: their task ids
// and when each was sent.
type liveTraffic struct {
	ids    []string
	sentAt map[string]time.Time
}

// sendLive sends a live pingback every drainLiveEvery, each from its own
// goroutine so that a slow answer does not slow the rate, until at least
// drainLiveAtLeast are sent and drained reports the backlog delivered, or
// deadline. It fails t unless every one was answered 200 "OK".
func sendLive(t *testing.T, client *http.Client, deadline time.Time, drained func() bool) liveTraffic {
	t.Helper()
	live := liveTraffic{sentAt: make(map[string]time.Time)}
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	tick := time.NewTicker(drainLiveEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		id := drainLiveID(i)
		live.ids = append(live.ids, id)
		live.sentAt[id] = time.Now()
		wg.Go(func() {
			if what := drainPingback(client, id); what != "" {
				mu.Lock()
				bad = append(bad, id+": "+what)
				mu.Unlock()
			}
		})
		<-tick.C
		if len(live.ids) >= drainLiveAtLeast && drained() || time.Now().After(deadline) {
			break
		}
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d of %d live pingbacks not answered 200 \"OK\", e.g. %s", len(bad), len(live.ids), bad[0])
	}
	return live
}

// earlyRetry is a request that came sooner than the Retry-After of the
// refusal before it.
type earlyRetry struct {
	id            string
	refused, next testkit.Exchange
}

// drainFigures is what the app saw of a drain.
type drainFigures struct {
	drainTime     time.Duration // from the app's return to the last backlog result's 2xx
	backlogDone   int           // backlog results delivered
	liveDone      int           // live results delivered
	liveSent      int
	p50, p99, max time.Duration // live results: provider's send to the app's 2xx
	liveRefused   int           // live results refused at least once
	refusals      int           // refusals (above the cap) in all
	liveRefusals  int           // of them, to live results
	twice         []string      // results delivered more than once
	early         []earlyRetry  // requests sooner than the Retry-After before them
}

func drainFiguresOf(app *testkit.CappedApp, upAt time.Time, backlog []string, live liveTraffic) drainFigures {
	f := drainFigures{liveSent: len(live.ids)}
	var lat []time.Duration
	for _, id := range append(slices.Clone(backlog), live.ids...) {
		ex := app.Exchanges(id)
		var delivered []testkit.Exchange
		refused := false
		for i, e := range ex {
			if e.Delivered() {
				delivered = append(delivered, e)
			}
			if !e.Refused {
				continue
			}
			refused = true
			f.refusals++
			if i+1 < len(ex) && ex[i+1].Arrived.Before(e.NotBefore.Add(-drainSlack)) {
				f.early = append(f.early, earlyRetry{id: id, refused: e, next: ex[i+1]})
			}
		}
		if len(delivered) > 1 {
			f.twice = append(f.twice, id)
		}
		sentAt, isLive := live.sentAt[id]
		if !isLive {
			if len(delivered) > 0 {
				f.backlogDone++
				f.drainTime = max(f.drainTime, delivered[0].Answered.Sub(upAt))
			}
			continue
		}
		if refused {
			f.liveRefused++
		}
		for _, e := range ex {
			if e.Refused {
				f.liveRefusals++
			}
		}
		if len(delivered) > 0 {
			f.liveDone++
			lat = append(lat, delivered[0].Answered.Sub(sentAt))
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		rank := func(q float64) time.Duration { return lat[max(int(math.Ceil(q*float64(len(lat))))-1, 0)] }
		f.p50, f.p99, f.max = rank(0.50), rank(0.99), lat[len(lat)-1]
	}
	return f
}

// log writes the figures the lead quotes.
func (f drainFigures) log(t *testing.T) {
	t.Helper()
	t.Logf("drain: %d/%d backlog results delivered, the last %.2fs after the app came back", f.backlogDone, drainBacklog, f.drainTime.Seconds())
	t.Logf("live: %d sent, %d delivered; latency p50 %.2fs, p99 %.2fs, max %.2fs; %d refused at least once (%.1f%%)",
		f.liveSent, f.liveDone, f.p50.Seconds(), f.p99.Seconds(), f.max.Seconds(), f.liveRefused, 100*float64(f.liveRefused)/float64(max(f.liveSent, 1)))
	t.Logf("refusals above the cap: %d in all, %d to live results, %d to backlog ones; %d retries sooner than Retry-After; %d results delivered twice",
		f.refusals, f.liveRefusals, f.refusals-f.liveRefusals, len(f.early), len(f.twice))
}

// startDrainCaddy starts Caddy with backoff 200ms 30s and the captchaai
// pingback on /cb in front of the app at appURL.
func startDrainCaddy(t *testing.T, appURL string) {
	t.Helper()
	startCaddy(t, "replay {\n\tbackoff 200ms 30s\n}", fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider captchaai
		}
		reverse_proxy %s
	}
}
`, testHTTPPort, strings.TrimPrefix(appURL, "http://")))
}
