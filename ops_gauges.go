package pingback

import (
	"context"
	"maps"
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
//
// A scrape reads store.Counter (in memory on Badger; a sum of a few
// counter rows on PostgreSQL, database-wide), never the records. Every
// state of a provider with stored results is exported, 0 included.
type countGauges struct {
	records, pending *prometheus.Desc
}

func newCountGauges() countGauges {
	return countGauges{
		records: prometheus.NewDesc("caddy_pingback_records",
			"Stored results by provider and delivery state (queued, forwarding, delivered, failed, rejected, parked).",
			[]string{"provider", "state"}, nil),
		pending: prometheus.NewDesc("caddy_pingback_tasks_pending",
			"Tracked tasks whose result has not arrived yet, by provider.", []string{"provider"}, nil),
	}
}

func (g countGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.records
	ch <- g.pending
}

func (g countGauges) Collect(ch chan<- prometheus.Metric) {
	c, ok := currentCounts()
	if !ok {
		return
	}
	for _, p := range countedProviders(c) {
		for _, st := range store.States {
			ch <- prometheus.MustNewConstMetric(g.records, prometheus.GaugeValue, float64(c.Records[p][st]), p, string(st))
		}
		ch <- prometheus.MustNewConstMetric(g.pending, prometheus.GaugeValue, float64(c.TasksPending[p]), p)
	}
}

// currentCounts reads the running app's store counts, within a second.
func currentCounts() (store.Counts, bool) {
	v, err := caddy.ActiveContext().AppIfConfigured("pingback")
	if err != nil {
		return store.Counts{}, false
	}
	st := v.(*App).store(100 * time.Millisecond)
	if st == nil {
		return store.Counts{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := st.Counts(ctx)
	return c, err == nil
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

// lastCallbacks is when this process last stored a live pingback, by
// provider (what last_callback_timestamp_seconds exports).
var lastCallbacks = &lastCallbackTimes{at: map[string]time.Time{}}

type lastCallbackTimes struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (l *lastCallbackTimes) set(provider string, t time.Time) {
	l.mu.Lock()
	l.at[provider] = t
	l.mu.Unlock()
}

func (l *lastCallbackTimes) all() map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.at)
}
