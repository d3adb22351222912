package pingback

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-pingback/pingback/internal/store"
)

// metrics are the plugin's Prometheus collectors. They are created once per
// process and registered into every config's registry, so /metrics keeps
// counting across reloads (the pattern of reverse_proxy's metrics.go).
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
	// storeWrites are the durable write path's counters (store.Stats):
	// group commits, the operations they carried, journal syncs and
	// checkpoints. Every acknowledged pingback was covered by one of the
	// syncs; operations per commit is the group commit's batch size.
	storeWrites []prometheus.Collector
	// loopLastRun is the Unix time (seconds) each loop (replay, poll)
	// last ran a round; both run at least every second while this process
	// owns the store's loops.
	loopLastRun *prometheus.GaugeVec
	// forwardDuration is the time of each forward to the app, from its
	// start to the app's answer (or its failure), by source (callback,
	// replay, poll) and outcome.
	forwardDuration *prometheus.HistogramVec
}

var (
	metricsOnce sync.Once
	theMetrics  *metrics
)

func registerMetrics(reg prometheus.Registerer) (*metrics, error) {
	metricsOnce.Do(func() {
		theMetrics = &metrics{
			callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "callbacks_total",
				Help: "Results received, by provider and result: pingbacks (stored, duplicate, conflict, invalid, not_result, store_error, quarantined, quarantine_full, unknown_id, corrected) and polled results too (poll_stored, poll_duplicate).",
			}, []string{"provider", "result"}),
			forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "forwards_total",
				Help: "Forwards to the app, by provider, source (callback, replay, poll) and outcome (delivered, failed, timeout, rejected, interrupted).",
			}, []string{"provider", "source", "outcome"}),
			tasks: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "tasks_total",
				Help: "Tracked tasks, by provider and event (tracked, recovered, expired).",
			}, []string{"provider", "event"}),
			parked: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "parked_total",
				Help: "Results parked after max_attempts (kept, not retried; list them with GET /pingback/records?state=parked).",
			}, []string{"provider"}),
			resphp: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "resphp_requests_total",
				Help: "Requests the poller sent to res.php, by provider and result (ok, error, bulk_mismatch).",
			}, []string{"provider", "result"}),
			expiredUndelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "expired_undelivered_total",
				Help: "Results whose retention ended before they were delivered, by provider and state (queued, failed, rejected, parked).",
			}, []string{"provider", "state"}),
			storeAvailable: prometheus.NewGauge(prometheus.GaugeOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "store_available",
				Help: "1 while the pingback store accepts writes, 0 while it refuses them (free space below min_free_space, or closed).",
			}),
			storeWrites: storeWriteCounters(),
			loopLastRun: prometheus.NewGaugeVec(prometheus.GaugeOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "loop_last_run_timestamp_seconds",
				Help: "Unix time each loop (replay, poll) last ran a round; both run at least every second, idle or not.",
			}, []string{"loop"}),
			forwardDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
				Namespace: "caddy", Subsystem: "pingback", Name: "forward_duration_seconds",
				Help:    "Time of each forward to the app until its answer or failure, by source (callback, replay, poll) and outcome.",
				Buckets: prometheus.ExponentialBuckets(0.001, 4, 9), // 1 ms .. 65 s
			}, []string{"source", "outcome"}),
		}
	})
	if reg == nil {
		return theMetrics, nil
	}
	for _, c := range append([]prometheus.Collector{theMetrics.callbacks, theMetrics.forwards, theMetrics.tasks, theMetrics.parked, theMetrics.resphp, theMetrics.expiredUndelivered, theMetrics.storeAvailable,
		theMetrics.loopLastRun, theMetrics.forwardDuration, newCountGauges(), quarantineBytes, confirmations}, theMetrics.storeWrites...) {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return theMetrics, nil
}

// storeWriteCounters exports store.ProcessStats.
func storeWriteCounters() []prometheus.Collector {
	counter := func(name, help string, v func(store.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "caddy", Subsystem: "pingback", Name: name, Help: help,
		}, func() float64 { return float64(v(store.ProcessStats())) })
	}
	return []prometheus.Collector{
		counter("store_commits_total", "Group commits of the pingback store.", func(s store.Stats) uint64 { return s.Commits }),
		counter("store_operations_total", "Operations the group commits carried (per commit: the batch size).", func(s store.Stats) uint64 { return s.Ops }),
		counter("store_syncs_total", "Completed fdatasyncs of the store's journal; every acknowledged write was covered by one before its answer.", func(s store.Stats) uint64 { return s.Syncs }),
		counter("store_checkpoints_total", "Completed checkpoints of the store's journal into Badger.", func(s store.Stats) uint64 { return s.Checkpoints }),
		counter("store_checkpoint_failures_total", "Failed checkpoints of the store's journal (each logged; the store is unavailable until one succeeds).", func(s store.Stats) uint64 { return s.CheckpointFailures }),
		syncHistogram{prometheus.NewDesc("caddy_pingback_store_sync_seconds",
			"Time of the journal's write and fdatasync of each group commit (the durable point before pingbacks are answered).", nil, nil)},
	}
}

// syncHistogram exports store.Stats' sync durations as a histogram.
type syncHistogram struct{ desc *prometheus.Desc }

func (h syncHistogram) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

func (h syncHistogram) Collect(ch chan<- prometheus.Metric) {
	s := store.ProcessStats()
	buckets := make(map[float64]uint64, len(store.SyncBuckets))
	var n uint64
	for i, le := range store.SyncBuckets {
		n += s.SyncSeconds[i]
		buckets[le] = n
	}
	n += s.SyncSeconds[len(store.SyncBuckets)]
	ch <- prometheus.MustNewConstHistogram(h.desc, n, s.SyncSum, buckets)
}
