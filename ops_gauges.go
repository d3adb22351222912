package pingback

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-pingback/pingback/internal/store"
)

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
			"Stored results by provider and delivery state (queued, forwarding, delivered, failed, rejected, parked, quarantined).",
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
	ages, agesOK := currentAges(ctx, st)
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

// loopRuns are the times each loop last ran a round in this process.
var loopRuns = &loopTimes{at: map[string]time.Time{}}

type loopTimes struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (l *loopTimes) set(loop string, t time.Time) {
	l.mu.Lock()
	l.at[loop] = t
	l.mu.Unlock()
}

func (l *loopTimes) get(loop string) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.at[loop]
}

// Interface guards
var _ prometheus.Collector = countGauges{}
