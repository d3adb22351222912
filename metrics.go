package pingback

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
)

// metrics are the plugin's Prometheus collectors. They are created once per
// process and registered into every config's registry, so /metrics keeps
// counting across reloads (the pattern of reverse_proxy's metrics, caddyhttp/reverseproxy).
type metrics struct {
	// callbacks counts results by provider and result: stored,
	// duplicate, conflict (a re-delivery with a different code),
	// invalid, not_result (a JSON callback whose error is not the task's
	// outcome: answered 200, not stored), store_error; poll_stored and
	// poll_duplicate for polled ones.
	callbacks *prometheus.CounterVec
	// forwards counts forwards to the app by provider, source (callback,
	// replay, poll) and outcome (delivered, failed, timeout, rejected,
	// interrupted).
	forwards *prometheus.CounterVec
	// tasks counts tracked tasks by provider and event: tracked,
	// recovered (result found by polling), expired.
	tasks *prometheus.CounterVec
	// unpollable counts tracked tasks, by provider, each once when it
	// became unpollable: submitted with an API key not in the provider's
	// api_key, or left pending by a reload that removed its key.
	unpollable *prometheus.CounterVec
	// parked counts results parked after max_attempts, by provider.
	parked *prometheus.CounterVec
	// resphp counts the poller's res.php requests by provider and result:
	// ok, error, bulk_mismatch.
	resphp *prometheus.CounterVec
	// expiredUndelivered counts results whose retention ended before they
	// were delivered, by provider and the state they ended in.
	expiredUndelivered *prometheus.CounterVec
	// storeAvailable is 1 while the store accepts writes, 0 while it
	// refuses them (free space below min_free_space, or closed).
	storeAvailable prometheus.Gauge
	// storeWrites are the durable write path's counters (badgerstore.Stats):
	// group commits, the operations they carried, journal syncs and
	// checkpoints. Every acknowledged pingback was covered by one of the
	// syncs; operations per commit is the group commit's batch size.
	// storeCounters are what they read: every Badger store this process
	// opens counts into them (badgerstore.Options.Counters).
	storeWrites   []prometheus.Collector
	storeCounters *badgerstore.Counters
	// loopLastRun is the Unix time (seconds) each loop (replay, poll)
	// last ran a round; both run at least every second while this process
	// owns the store's loops.
	loopLastRun *prometheus.GaugeVec
	// forwardDuration is the time of each forward to the app, from its
	// start to the app's answer (or its failure), by source (callback,
	// replay, poll) and outcome.
	forwardDuration *prometheus.HistogramVec
	// deliveryAge is the time from a task's submission (tracked) or else
	// the result's receipt to its delivery, by provider and source
	// (App.noteForwardEnded).
	deliveryAge *prometheus.HistogramVec
	// routeReplayConcurrency is, per server and provider, how many
	// replays of one of its routes may be in flight at once now: the
	// lowest among its routes, the app's replay concurrency when none is
	// held back. Set by setRouteGauges; no paths in the labels (a path
	// may hold a secret).
	routeReplayConcurrency *prometheus.GaugeVec
	// routePausedUntil is, per server and provider, the Unix time
	// (seconds) until which replays of one of its routes are paused (the
	// latest among its routes); 0 when none is paused. Set by
	// setRouteGauges.
	routePausedUntil *prometheus.GaugeVec

	// routeSeries are the server and provider pairs the route gauges
	// have a series for, so that a pair whose routes are no longer held
	// back is set back to the max and 0 instead of keeping its last
	// figures.
	routeMu     sync.Mutex
	routeSeries map[serverProvider]bool
}

var (
	metricsOnce sync.Once
	theMetrics  *metrics
)

func registerMetrics(reg prometheus.Registerer) (*metrics, error) {
	metricsOnce.Do(func() {
		theMetrics = &metrics{
			callbacks: newCounterVec("callbacks_total", []string{"provider", "result"},
				"Results received, by provider and result: pingbacks (stored, duplicate, conflict, invalid, not_result, store_error, quarantined, quarantine_full, unknown_id, corrected) and polled results too (poll_stored, poll_duplicate)."),
			forwards: newCounterVec("forwards_total", []string{"provider", "source", "outcome"},
				"Forwards to the app, by provider, source (callback, replay, poll) and outcome (delivered, failed, timeout, rejected, interrupted)."),
			tasks: newCounterVec("tasks_total", []string{"provider", "event"},
				"Tracked tasks, by provider and event (tracked, recovered, expired)."),
			unpollable: newCounterVec("tasks_unpollable_total", []string{"provider"},
				"Tracked tasks that became unpollable, by provider: submitted with an API key not in the provider's api_key (or left pending by a reload that removed it); their results can only arrive by pingback."),
			parked: newCounterVec("parked_total", []string{"provider"},
				"Results parked after max_attempts (kept, not retried; list them with GET /pingback/records?state=parked)."),
			resphp: newCounterVec("resphp_requests_total", []string{"provider", "result"},
				"Requests the poller sent to res.php, by provider and result (ok, error, bulk_mismatch)."),
			expiredUndelivered: newCounterVec("expired_undelivered_total", []string{"provider", "state"},
				"Results whose retention ended before they were delivered, by provider and state (queued, failed, rejected, parked, quarantined, expired)."),
			storeAvailable: prometheus.NewGauge(prometheus.GaugeOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "store_available",
				Help: "1 while the pingback store accepts writes, 0 while it refuses them (free space below min_free_space, or closed).",
			}),
			storeCounters: new(badgerstore.Counters),
			loopLastRun: newGaugeVec("loop_last_run_timestamp_seconds", []string{"loop"},
				"Unix time each loop (replay, poll) last ran a round; both run at least every second, idle or not."),
			forwardDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "forward_duration_seconds",
				Help:    "Time of each forward to the app until its answer or failure, by source (callback, replay, poll) and outcome.",
				Buckets: prometheus.ExponentialBuckets(0.001, 4, 9), // 1 ms .. 65 s
			}, []string{"source", "outcome"}),
			routeSeries: map[serverProvider]bool{},
		}
		theMetrics.deliveryAge = newDeliveryAge()
		theMetrics.routeReplayConcurrency, theMetrics.routePausedUntil = newRouteGauges()
		theMetrics.storeWrites = storeWriteCounters(theMetrics.storeCounters)
	})
	if reg == nil {
		return theMetrics, nil
	}
	for _, c := range append([]prometheus.Collector{theMetrics.callbacks, theMetrics.forwards, theMetrics.tasks, theMetrics.unpollable, theMetrics.parked, theMetrics.resphp, theMetrics.expiredUndelivered, theMetrics.storeAvailable,
		theMetrics.loopLastRun, theMetrics.forwardDuration, theMetrics.deliveryAge, theMetrics.routeReplayConcurrency, theMetrics.routePausedUntil, newCountGauges(), quarantineBytes, confirmations, maxAgeExpired, pausedGauge}, theMetrics.storeWrites...) {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return theMetrics, nil
}

// newDeliveryAge creates delivery_age_seconds, bucketed like the
// history's delay and age (store.HistoryBoundsMs).
func newDeliveryAge() *prometheus.HistogramVec {
	buckets := make([]float64, len(store.HistoryBoundsMs))
	for i, ms := range store.HistoryBoundsMs {
		buckets[i] = ms / 1000
	}
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "caddy", Subsystem: "pingback", Name: "delivery_age_seconds",
		Help:    "Time from a task's submission (tracked tasks) or else the result's receipt to its delivery to the app, by provider and source (callback, replay, poll).",
		Buckets: buckets,
	}, []string{"provider", "source"})
}

// newCounterVec returns the counter caddy_pingback_<name> with its help
// text and labels.
func newCounterVec(name string, labels []string, help string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "caddy", Subsystem: "pingback", Name: name, Help: help}, labels)
}

// newGaugeVec returns the gauge caddy_pingback_<name> with its help text
// and labels.
func newGaugeVec(name string, labels []string, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "caddy", Subsystem: "pingback", Name: name, Help: help}, labels)
}

// serverProvider labels the route gauges: a Caddy server's name and a
// provider.
type serverProvider struct{ server, provider string }

// routeGauge is one route's replay flow control as the route gauges see
// it: the route's server and provider (never its path), its replay
// concurrency now, and until when its replays are paused (the zero time:
// not paused).
type routeGauge struct {
	Server, Provider string
	Concurrency      int
	PausedUntil      time.Time
}

// newRouteGauges creates the route gauges, labelled by server and
// provider: route_replay_concurrency and
// route_paused_until_timestamp_seconds.
func newRouteGauges() (concurrency, pausedUntil *prometheus.GaugeVec) {
	concurrency = newGaugeVec("route_replay_concurrency", []string{"server", "provider"},
		"Replays of a route that may be in flight at once now, by server and provider: the lowest among their routes (lowered after a 429, or a 503 with Retry-After), the replay concurrency when none is held back.")
	pausedUntil = newGaugeVec("route_paused_until_timestamp_seconds", []string{"server", "provider"},
		"Unix time until which replays of a route are paused (after a 429, or a 503 with Retry-After), by server and provider: the latest among their routes; 0 when none is paused.")
	return concurrency, pausedUntil
}

// setRouteGauges sets route_replay_concurrency and
// route_paused_until_timestamp_seconds from routes, the routes of this
// process's flow control (those back at max concurrency and not paused may
// be left out). Per server and provider: the lowest concurrency, and the
// latest pause that has not ended at now (0 when none). A pair set before
// that routes no longer names is set back to replayConcurrency (the app's
// replay concurrency, the most a route can have) and 0; a pair never held
// back has no series.
func (m *metrics) setRouteGauges(routes []routeGauge, replayConcurrency int, now time.Time) {
	type figures struct {
		concurrency int
		paused      time.Time
	}
	pairs := map[serverProvider]figures{}
	for _, r := range routes {
		k := serverProvider{r.Server, r.Provider}
		f, ok := pairs[k]
		if !ok || r.Concurrency < f.concurrency {
			f.concurrency = r.Concurrency
		}
		if r.PausedUntil.After(now) && r.PausedUntil.After(f.paused) {
			f.paused = r.PausedUntil
		}
		pairs[k] = f
	}
	m.routeMu.Lock()
	defer m.routeMu.Unlock()
	for k := range m.routeSeries {
		if _, ok := pairs[k]; !ok {
			pairs[k] = figures{concurrency: replayConcurrency}
		}
	}
	for k, f := range pairs {
		m.routeSeries[k] = true
		m.routeReplayConcurrency.WithLabelValues(k.server, k.provider).Set(float64(f.concurrency))
		paused := 0.0
		if !f.paused.IsZero() {
			paused = float64(f.paused.UnixNano()) / 1e9
		}
		m.routePausedUntil.WithLabelValues(k.server, k.provider).Set(paused)
	}
}

// storeWriteCounters exports c, the counters of the process's Badger stores.
func storeWriteCounters(c *badgerstore.Counters) []prometheus.Collector {
	counter := func(name, help string, v func(badgerstore.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "caddy", Subsystem: "pingback", Name: name, Help: help,
		}, func() float64 { return float64(v(c.Stats())) })
	}
	return []prometheus.Collector{
		counter("store_commits_total", "Group commits of the pingback store.", func(s badgerstore.Stats) uint64 { return s.Commits }),
		counter("store_operations_total", "Operations the group commits carried (per commit: the batch size).", func(s badgerstore.Stats) uint64 { return s.Ops }),
		counter("store_syncs_total", "Completed fdatasyncs of the store's journal; every acknowledged write was covered by one before its answer.", func(s badgerstore.Stats) uint64 { return s.Syncs }),
		counter("store_checkpoints_total", "Completed checkpoints of the store's journal into Badger.", func(s badgerstore.Stats) uint64 { return s.Checkpoints }),
		counter("store_checkpoint_failures_total", "Failed checkpoints of the store's journal (each logged; the store is unavailable until one succeeds).", func(s badgerstore.Stats) uint64 { return s.CheckpointFailures }),
		syncHistogram{c, prometheus.NewDesc("caddy_pingback_store_sync_seconds",
			"Time of the journal's write and fdatasync of each group commit (the durable point before pingbacks are answered).", nil, nil)},
	}
}

// syncHistogram exports badgerstore.Stats' sync durations as a histogram.
type syncHistogram struct {
	c    *badgerstore.Counters
	desc *prometheus.Desc
}

func (h syncHistogram) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

func (h syncHistogram) Collect(ch chan<- prometheus.Metric) {
	s := h.c.Stats()
	bounds := badgerstore.SyncBuckets()
	buckets := make(map[float64]uint64, len(bounds))
	var n uint64
	for i, le := range bounds {
		n += s.SyncSeconds[i]
		buckets[le] = n
	}
	n += s.SyncSeconds[len(bounds)]
	ch <- prometheus.MustNewConstHistogram(h.desc, n, s.SyncSum, buckets)
}

// countGauges exports the store's counts at each scrape:
//
//	caddy_pingback_records{provider,state}   stored results by delivery state
//	caddy_pingback_tasks_pending{provider}   tracked tasks still pending
//	caddy_pingback_oldest_pending_task_age_seconds{provider}
//	caddy_pingback_oldest_undelivered_age_seconds{provider}
//	caddy_pingback_last_callback_timestamp_seconds{provider}
//
// A scrape reads store.Counter (in memory on Badger; a sum of a few
// counter rows on PostgreSQL, database-wide), never the records; the ages
// come from Counter.Ages at most once a second (see currentAges). Every
// state of a provider with stored results is exported, 0 included, and
// both ages (0 when there is nothing to age); the last callback of a
// provider that never had one is not exported.
type countGauges struct {
	records, pending, pendingAge, backlogAge, lastCallback *prometheus.Desc
}

func newCountGauges() countGauges {
	return countGauges{
		records: prometheus.NewDesc("caddy_pingback_records",
			"Stored results by provider and delivery state (queued, forwarding, delivered, failed, rejected, parked, quarantined, expired).",
			[]string{"provider", "state"}, nil),
		pending: prometheus.NewDesc("caddy_pingback_tasks_pending",
			"Tracked tasks whose result has not arrived yet, by provider.", []string{"provider"}, nil),
		pendingAge: prometheus.NewDesc("caddy_pingback_oldest_pending_task_age_seconds",
			"Age of the oldest tracked task still pending (since its submission), by provider; 0 when none is pending.",
			[]string{"provider"}, nil),
		backlogAge: prometheus.NewDesc("caddy_pingback_oldest_undelivered_age_seconds",
			"Age of the oldest result in state failed or forwarding (since it was received): the retry backlog's age, by provider; 0 when there is none.",
			[]string{"provider"}, nil),
		lastCallback: prometheus.NewDesc("caddy_pingback_last_callback_timestamp_seconds",
			"Unix time the last live pingback was stored, by provider (duplicates and polled results not counted), from the store: it survives restarts.",
			[]string{"provider"}, nil),
	}
}

func (g countGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.records
	ch <- g.pending
	ch <- g.pendingAge
	ch <- g.backlogAge
	ch <- g.lastCallback
}

func (g countGauges) Collect(ch chan<- prometheus.Metric) {
	a, st := activeStore()
	if st == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := st.Counts(ctx)
	if err != nil {
		return
	}
	ages, agesOK := a.currentAges(ctx, st)
	now := a.now()
	for _, p := range countedProviders(c) {
		for _, st := range store.States {
			ch <- prometheus.MustNewConstMetric(g.records, prometheus.GaugeValue, float64(c.Records[p][st]), p, string(st))
		}
		ch <- prometheus.MustNewConstMetric(g.pending, prometheus.GaugeValue, float64(c.TasksPending[p]), p)
		if agesOK {
			ch <- prometheus.MustNewConstMetric(g.pendingAge, prometheus.GaugeValue, ageAt(ages.OldestPendingTask[p], now), p)
			ch <- prometheus.MustNewConstMetric(g.backlogAge, prometheus.GaugeValue, ageAt(ages.OldestUndelivered[p], now), p)
		}
	}
	for p, t := range ages.LastCallback {
		ch <- prometheus.MustNewConstMetric(g.lastCallback, prometheus.GaugeValue, float64(t.UnixNano())/1e9, p)
	}
}

// activeStore is the running app and its store, or nil.
func activeStore() (*App, store.Store) {
	v, err := caddy.ActiveContext().AppIfConfigured("pingback")
	if err != nil {
		return nil, nil
	}
	a := v.(*App)
	return a, a.store(100 * time.Millisecond)
}

// countedProviders lists, sorted, the providers the counts name.
func countedProviders(c store.Counts) []string {
	var ps []string
	for p := range c.Records {
		ps = append(ps, p)
	}
	for p := range c.TasksPending {
		if _, ok := c.Records[p]; !ok {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// loopTimes are the times each loop (replay, poll) last ran a round on
// one store in this process (storeHandle.loops).
type loopTimes struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (l *loopTimes) set(loop string, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at == nil {
		l.at = map[string]time.Time{}
	}
	l.at[loop] = t
}

func (l *loopTimes) get(loop string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.at[loop]
}

// loopLastRun is when loop last ran a round on the app's store in this
// process (by this config or an earlier one); the zero time if never or
// before Start.
func (a *App) loopLastRun(loop string) time.Time {
	h := a.readyHandle()
	if h == nil {
		return time.Time{}
	}
	return h.loops.get(loop)
}

// agesEvery bounds how often a shared store is asked for its ages
// (store.Counter.Ages): on PostgreSQL that is a few index descents per
// provider, shared by every scrape and GET /pingback/status within it; an
// age gauge is then at most this stale. Badger keeps them in memory and is
// asked every time.
const agesEvery = time.Second

// agesCache holds the last ages read from one store (storeHandle.ages).
type agesCache struct {
	mu   sync.Mutex
	at   time.Time
	ages store.Ages
}

// currentAges returns st's ages, read at most once per agesEvery when st
// is the store of a's handle (the cache is the handle's, shared across
// reloads); false if the store could not answer.
func (a *App) currentAges(ctx context.Context, st store.Store) (store.Ages, bool) {
	h := a.readyHandle()
	if _, inMemory := st.(*badgerstore.Badger); inMemory || h == nil || h.store != st {
		ages, err := st.Ages(ctx)
		return ages, err == nil
	}
	c := &h.ages
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < agesEvery {
		return c.ages, true
	}
	ages, err := st.Ages(ctx)
	if err != nil {
		return store.Ages{}, false
	}
	c.at, c.ages = time.Now(), ages
	return ages, true
}

// ageAt is how long before now t was, in seconds; 0 for the zero time
// (nothing to age) and never negative.
func ageAt(t, now time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return max(0, now.Sub(t).Seconds())
}

// roundAge rounds an age to the millisecond, for JSON.
func roundAge(s float64) float64 { return math.Round(s*1000) / 1000 }

// loopRan sets loop_last_run_timestamp_seconds of loop (replay, poll) to
// now, and the time GET /pingback/status shows.
func (a *App) loopRan(loop string) {
	now := a.now()
	a.metrics.loopLastRun.WithLabelValues(loop).Set(float64(now.UnixNano()) / 1e9)
	a.handle.loops.set(loop, now)
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// quarantineBytes is the gauge of quarantined bytes per provider.
var quarantineBytes = newGaugeVec("quarantine_bytes", []string{"provider"},
	"Bytes of quarantined pingbacks (request body, headers, URI, code) held per provider, capped by max_quarantine.")

// confirmations counts confirmation jobs by provider and outcome
// (started, coalesced, dropped).
var confirmations = newCounterVec("confirmations_total", []string{"provider", "outcome"},
	"Confirmations with the provider (res_php, conflicts), by provider and outcome: started, coalesced (one for the id already in flight), dropped (the provider's queue of confirmation_queue jobs full).")

// Interface guards
var _ prometheus.Collector = countGauges{}
