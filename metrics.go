package pingback

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the plugin's Prometheus collectors. They are created once per
// process and registered into every config's registry, so /metrics keeps
// counting across reloads (the pattern of reverse_proxy's metrics.go).
type metrics struct {
	// callbacks counts results by provider and result: stored,
	// duplicate, conflict (a re-delivery with a different code),
	// invalid, store_error; poll_stored and poll_duplicate for polled ones.
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
				Help: "Pingbacks received, by provider and result (stored, duplicate, conflict, invalid, store_error).",
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
		}
	})
	if reg == nil {
		return theMetrics, nil
	}
	for _, c := range []prometheus.Collector{theMetrics.callbacks, theMetrics.forwards, theMetrics.tasks, theMetrics.parked, theMetrics.resphp, theMetrics.expiredUndelivered, theMetrics.storeAvailable} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
		}
	}
	return theMetrics, nil
}
