package pingback

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// historyApp is an app on the store handle h whose clock is clock, ready
// as after Start, without loops: the test runs historyRound itself.
func historyApp(t *testing.T, h *storeHandle, clock func() time.Time) *App {
	t.Helper()
	m, err := registerMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	a := &App{logger: zap.NewNop(), handle: h, now: clock, metrics: m, ready: make(chan struct{}),
		Retention: caddy.Duration(DefaultRetention), loopCtx: context.Background()}
	close(a.ready)
	return a
}

// openHistoryHandle opens the store of mod as Start does.
func openHistoryHandle(t *testing.T, mod StoreModule) *storeHandle {
	t.Helper()
	if p, ok := mod.(caddy.Provisioner); ok {
		if err := p.Provision(caddy.Context{}); err != nil {
			t.Fatal(err)
		}
	}
	h, err := openStoreHandle(mod, -1, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// roundWritten runs a's history round and waits for its write to end.
func roundWritten(t *testing.T, a *App) {
	t.Helper()
	a.historyRound()
	testkit.WaitFor(t, 5*time.Second, "the history round's write", func() bool { return !a.handle.history.writing.Load() })
}

// forwardEnded counts the end of one forward of a result received delay
// before now (submitted age before now when age is longer), as
// App.deliver does.
func forwardEnded(a *App, class outcomeClass, delay, age time.Duration) {
	now := a.now()
	rec := &store.Record{Provider: "captchaai", ID: "1", ReceivedAt: now.Add(-delay)}
	if age > delay {
		rec.SubmittedAt = now.Add(-age)
	}
	a.noteForwardEnded(delivery{rec: rec, src: store.SourceCallback}, outcome{class: class})
}

// backlogRecord is a stored record of state st received at t.
func backlogRecord(id string, st store.State, t time.Time) *store.Record {
	return &store.Record{Provider: "captchaai", ID: id, Code: "C" + id, Source: store.SourceCallback, ReceivedAt: t,
		Request:   store.Request{Method: http.MethodGet, URI: "/cb?id=" + id, Host: "localhost", Proto: "HTTP/1.1"},
		Delivery:  store.Delivery{State: st, Attempts: 1, Failures: 1, DueAt: t.Add(time.Hour), UpdatedAt: t},
		ExpiresAt: time.Now().Add(48 * time.Hour),
	}
}

// scriptedMinute is what the scripted hour does in its minute i, and so
// what the history must show for it.
type scriptedMinute struct {
	stored, duplicates, delivered, failed int
	delay                                 time.Duration // of each delivery; its age is twice that
	parked, expired                       int
	failedBacklog                         int64 // records in state failed at the minute's end
}

func scripted(i int) scriptedMinute {
	m := scriptedMinute{stored: i%5 + 1, duplicates: i % 3, delivered: i % 4, failed: i % 2,
		delay: time.Duration(i+1) * 40 * time.Millisecond, failedBacklog: int64(i / 10)}
	if i == 30 {
		m.parked = 2
	}
	if i == 45 {
		m.expired = 3
	}
	return m
}

// TestHistoryScriptedHour plays an hour of traffic minute by minute on an
// injected clock and checks that the history shows each minute's figures
// (received by result, deliveries by outcome, the backlog at the minute's
// end, the delay and age percentiles), written once a minute; then the
// store is closed mid-minute and reopened (a restart): every minute is
// still there, the one in progress included.
func TestHistoryScriptedHour(t *testing.T) {
	dir := t.TempDir()
	mod := &BadgerStore{Dir: dir}
	h := openHistoryHandle(t, mod)
	t0 := time.Now().UTC().Truncate(time.Minute).Add(-2 * time.Hour)
	clock := testkit.NewClock(t0)
	a := historyApp(t, h, clock.Now)
	ctx := context.Background()

	for i := range 60 {
		m := scripted(i)
		clock.Advance(time.Second)
		for range m.stored {
			a.countReceived("captchaai", "stored")
		}
		for range m.duplicates {
			a.countReceived("captchaai", "duplicate")
		}
		for range m.delivered {
			forwardEnded(a, delivered, m.delay, 2*m.delay)
		}
		for range m.failed {
			forwardEnded(a, retryable, m.delay, 0)
		}
		for range m.parked {
			a.handle.noteParked()
		}
		for range m.expired {
			a.handle.noteExpired()
		}
		if i%10 == 0 && i > 0 { // one more failed record every ten minutes
			if _, err := h.store.Insert(ctx, backlogRecord(strconv.Itoa(i), store.StateFailed, clock.Now())); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(time.Minute - time.Second) // the next minute begins
		roundWritten(t, a)
	}
	// Half a minute more: counted, not written before the close.
	clock.Advance(30 * time.Second)
	a.countReceived("captchaai", "poll_stored")

	check := func(what string, a *App) {
		t.Helper()
		ans, err := a.History(ctx, t0, t0.Add(61*time.Minute))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(ans.Points) != 61 {
			t.Fatalf("%s: %d points, want 61", what, len(ans.Points))
		}
		for i, p := range ans.Points[:60] {
			m := scripted(i)
			want := adminapi.HistoryPoint{
				Minute:     t0.Add(time.Duration(i) * time.Minute),
				Received:   nonZero(map[string]int64{"stored": int64(m.stored), "duplicate": int64(m.duplicates)}),
				Deliveries: nonZero(map[string]int64{"delivered": int64(m.delivered), "failed": int64(m.failed), "parked": int64(m.parked), "expired": int64(m.expired)}),
				Backlog:    map[store.State]int64{},
			}
			if m.failedBacklog > 0 {
				want.Backlog[store.StateFailed] = m.failedBacklog
			}
			if m.delivered > 0 {
				b := store.HistoryBucket(m.delay)
				lower := 0.0
				if b > 0 {
					lower = store.HistoryBoundsMs[b-1]
				}
				// Every delivery of the minute is in one bucket: p50 is
				// its middle, interpolated.
				wantP50 := lower + (store.HistoryBoundsMs[b]-lower)/2
				if p.DelayMs.Count != int64(m.delivered) || p.AgeMs.Count != int64(m.delivered) || !near(p.DelayMs.P50, wantP50) {
					t.Errorf("%s: minute %d: delay %+v, age %+v; want %d deliveries, p50 %.3f ms", what, i, p.DelayMs, p.AgeMs, m.delivered, wantP50)
				}
				if ms := float64(m.delay.Milliseconds()); p.DelayMs.P95 < ms*0.4 || p.DelayMs.P95 > ms*2.5 || p.AgeMs.P95 < p.DelayMs.P95 {
					t.Errorf("%s: minute %d: delay p95 %.1f ms, age p95 %.1f ms for deliveries of %s and age twice that", what, i, p.DelayMs.P95, p.AgeMs.P95, m.delay)
				}
			} else if p.DelayMs.Count != 0 {
				t.Errorf("%s: minute %d: %d delays, want none", what, i, p.DelayMs.Count)
			}
			p.DelayMs, p.AgeMs = adminapi.HistoryPercentiles{}, adminapi.HistoryPercentiles{}
			if got, w := fmt.Sprint(p), fmt.Sprint(want); got != w {
				t.Errorf("%s: minute %d:\n got %s\nwant %s", what, i, got, w)
			}
		}
		if last := ans.Points[60]; last.Received["poll_stored"] != 1 {
			t.Errorf("%s: the minute in progress shows %v received, want poll_stored 1", what, last.Received)
		}
	}
	check("running", a)

	stored, err := h.history.hs.Minutes(ctx, t0, t0.Add(time.Hour))
	if err != nil || len(stored) != 60 {
		t.Fatalf("%d minute records written for the hour (%v), want 60: one per minute", len(stored), err)
	}
	if err := h.Destruct(); err != nil {
		t.Fatal(err)
	}
	h2 := openHistoryHandle(t, mod)
	defer h2.Destruct()
	check("after a restart", historyApp(t, h2, clock.Now))
}

func nonZero(m map[string]int64) map[string]int64 {
	for k, n := range m {
		if n == 0 {
			delete(m, k)
		}
	}
	return m
}

func near(a, b float64) bool { return a-b < 0.01 && b-a < 0.01 }

// TestHistoryMinutesPruned checks that the housekeeping prunes the minute
// records older than the retention and keeps the others.
func TestHistoryMinutesPruned(t *testing.T) {
	h := openHistoryHandle(t, &BadgerStore{Dir: t.TempDir()})
	defer h.Destruct()
	now := time.Now().UTC().Truncate(time.Minute)
	a := historyApp(t, h, func() time.Time { return now })
	ctx := context.Background()
	for _, age := range []time.Duration{25 * time.Hour, 24*time.Hour + time.Minute, 23 * time.Hour, time.Minute} {
		if err := h.history.hs.WriteMinute(ctx, store.HistoryMinute{Minute: now.Add(-age), Instance: "x", Received: map[string]int64{"stored": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	a.pruneHistory(h.store)
	left, err := h.history.hs.Minutes(ctx, now.Add(-48*time.Hour), now)
	if err != nil || len(left) != 2 || !left[0].Minute.Equal(now.Add(-23*time.Hour)) {
		t.Fatalf("after pruning: %d minute records (%v), want the 2 within the retention (23 h and 1 min old)", len(left), err)
	}
}

// TestHistoryTwoInstancesPostgres runs two instances on one PostgreSQL
// store: each writes its own minute records, and either one's history
// shows their sums, with the backlog of the latest sample.
func TestHistoryTwoInstancesPostgres(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	t0 := time.Now().UTC().Truncate(time.Minute).Add(-time.Hour)
	clock := testkit.NewClock(t0)
	var apps []*App
	for range 2 {
		h := openHistoryHandle(t, &PostgresStore{DSN: dsn, Schema: schema})
		defer h.Destruct()
		apps = append(apps, historyApp(t, h, clock.Now))
	}
	ctx := context.Background()
	for i := range 3 {
		clock.Advance(time.Second)
		for k, a := range apps {
			for range (k + 1) * (i + 1) { // instance 0: 1, 2, 3; instance 1: 2, 4, 6
				a.countReceived("captchaai", "stored")
				forwardEnded(a, delivered, 30*time.Millisecond, 0)
			}
		}
		if i == 1 {
			if _, err := apps[0].handle.store.Insert(ctx, backlogRecord("b1", store.StateParked, clock.Now())); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(time.Minute - time.Second)
		for _, a := range apps {
			roundWritten(t, a)
		}
	}
	for k, a := range apps {
		ans, err := a.History(ctx, t0, t0.Add(3*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range ans.Points {
			n := int64(3 * (i + 1))
			if p.Received["stored"] != n || p.Deliveries["delivered"] != n || p.DelayMs.Count != n {
				t.Errorf("instance %d: minute %d: received %v, deliveries %v, %d delays; want %d of each, both instances summed", k, i, p.Received, p.Deliveries, p.DelayMs.Count, n)
			}
			if want := int64(min(i, 1)); p.Backlog[store.StateParked] != want {
				t.Errorf("instance %d: minute %d: backlog %v, want %d parked (not summed over the instances)", k, i, p.Backlog, want)
			}
		}
	}
}

// TestHistoryThroughCaddy sends pingbacks through a real Caddy and reads
// GET /pingback/history from its admin endpoint: the minute shows what
// was received and delivered (this process's figures before they are
// written), delivery_age_seconds counted the deliveries, and bad input
// gets 400 with a reason.
func TestHistoryThroughCaddy(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "", app))
	ages := theMetricsOrFail(t).deliveryAge.WithLabelValues("captchaai", "callback")
	agesBefore := histogramCount(t, ages)
	from := time.Now().UTC().Add(-time.Minute)
	for _, id := range []string{"91", "92"} {
		if status, body := testkit.Get(t, testBase+"/cb?id="+id+"&code=T"+id); status != 200 || body != "OK" {
			t.Fatalf("pingback %s: %d %q", id, status, body)
		}
	}
	testkit.Get(t, testBase+"/cb?id=91&code=T91") // a duplicate
	testkit.WaitFor(t, 5*time.Second, "both delivered", func() bool {
		return getRecord(t, "captchaai", "91").State == store.StateDelivered && getRecord(t, "captchaai", "92").State == store.StateDelivered
	})
	path := "/pingback/history?from=" + url.QueryEscape(from.Format(time.RFC3339))
	var sums adminapi.HistoryPoint
	testkit.WaitFor(t, 5*time.Second, "the history to show the deliveries", func() bool {
		status, body := adminDo(t, http.MethodGet, path, "")
		var ans adminapi.HistoryAnswer
		if status != 200 || json.Unmarshal(body, &ans) != nil {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		sums = adminapi.HistoryPoint{Received: map[string]int64{}, Deliveries: map[string]int64{}}
		for _, p := range ans.Points {
			for k, n := range p.Received {
				sums.Received[k] += n
			}
			for k, n := range p.Deliveries {
				sums.Deliveries[k] += n
			}
			sums.DelayMs.Count += p.DelayMs.Count
		}
		return sums.Deliveries["delivered"] == 2
	})
	if sums.Received["stored"] != 2 || sums.Received["duplicate"] != 1 || sums.DelayMs.Count != 2 {
		t.Errorf("history since %s: received %v, %d delays; want stored 2, duplicate 1, 2 delays", from, sums.Received, sums.DelayMs.Count)
	}
	if n := histogramCount(t, ages) - agesBefore; n != 2 {
		t.Errorf("delivery_age_seconds{captchaai,callback} counted %d deliveries, want 2", n)
	}
	for _, q := range []string{"from=yesterday", "from=2026-12-01T10:00:00Z&to=2026-12-01T09:00:00Z", "from=2026-11-01T10:00:00Z&to=2026-12-01T10:00:00Z"} {
		if status, body := adminDo(t, http.MethodGet, "/pingback/history?"+q, ""); status != 400 || len(body) < 20 {
			t.Errorf("GET /pingback/history?%s: %d %s, want 400 with a reason", q, status, body)
		}
	}
}

func theMetricsOrFail(t *testing.T) *metrics {
	t.Helper()
	m, err := registerMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// histogramCount is the number of observations of a histogram series.
func histogramCount(t *testing.T, o any) uint64 {
	t.Helper()
	var m dto.Metric
	if err := o.(interface{ Write(*dto.Metric) error }).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestHistoryOfAMillionRecords times GET /pingback/history for 24 h (two
// instances' minute records, every minute) from a store of 1,000,000
// records: under a second (times testkit.Slowdown under -race), as the
// minute records are read apart from the records.
func TestHistoryOfAMillionRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("fills a store with 1,000,000 records")
	}
	const records, workers = 1_000_000, 512
	dir := t.TempDir()
	h := openHistoryHandle(t, &BadgerStore{Dir: dir})
	ctx := context.Background()
	started := time.Now()
	received := time.Now().UTC().Add(-time.Hour)
	errs := make(chan error, 24*60)
	for w := range workers {
		go func() {
			for i := w; i < records; i += workers {
				rec := backlogRecord(strconv.Itoa(i), store.StateDelivered, received)
				rec.Delivery.Failures, rec.Delivery.DueAt = 0, time.Time{}
				if _, err := h.store.Insert(ctx, rec); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC().Truncate(time.Minute)
	full := make([]uint64, store.HistoryBuckets)
	for i := range full {
		full[i] = uint64(i + 1)
	}
	for i := range 24 * 60 { // both instances' minutes at once: a group commit each
		go func() {
			for _, inst := range []string{"instance-a", "instance-b"} {
				m := store.HistoryMinute{Minute: now.Add(-time.Duration(i+1) * time.Minute), Instance: inst,
					Received:   map[string]int64{"stored": 700, "duplicate": 12, "quarantined": 1, "poll_stored": 3},
					Deliveries: map[string]int64{"delivered": 690, "failed": 20, "timeout": 2, "rejected": 1, "parked": 1},
					Backlog:    map[store.State]int64{store.StateFailed: 20, store.StateQueued: 3, store.StateParked: 9},
					SampledAt:  now, Delay: full, Age: full}
				if err := h.history.hs.WriteMinute(ctx, m); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 24 * 60 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	filled := time.Since(started)
	c, err := h.store.Counts(ctx)
	if err != nil || c.Records["captchaai"][store.StateDelivered] != records {
		t.Fatalf("the store counts %v (%v), want %d delivered records", c.Records, err, records)
	}
	if err := h.Destruct(); err != nil {
		t.Fatal(err)
	}
	t.Logf("filled %d records and 24 h of minute records in %s", records, filled.Round(time.Second))

	startCaddyBadger(t, "storage_dir "+dir, "")
	path := "/pingback/history?from=" + url.QueryEscape(now.Add(-24*time.Hour).Format(time.RFC3339)) + "&to=" + url.QueryEscape(now.Format(time.RFC3339))
	adminDo(t, http.MethodGet, "/pingback/status", "") // the store is open
	began := time.Now()
	status, body := adminDo(t, http.MethodGet, path, "")
	took := time.Since(began)
	var ans adminapi.HistoryAnswer
	if status != 200 || json.Unmarshal(body, &ans) != nil {
		t.Fatalf("GET %s: %d %.200s", path, status, body)
	}
	if len(ans.Points) != 24*60 || ans.Points[0].Received["stored"] != 1400 || ans.Points[0].Backlog[store.StateFailed] != 20 {
		t.Fatalf("%d points, the first %+v; want 1440, each with both instances' figures", len(ans.Points), ans.Points[0])
	}
	t.Logf("24 h of history (%d bytes) in %s", len(body), took)
	if budget := time.Second * testkit.Slowdown; took > budget {
		t.Errorf("24 h of history took %s, want under %s", took, budget)
	}
}
