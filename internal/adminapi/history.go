package adminapi

import (
	"math"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// HistoryStep is the step of the history's points: one a minute.
const HistoryStep = time.Minute

// HistoryAnswer is the body of GET /pingback/history: per-minute points
// from From to To (To excluded), every minute present.
type HistoryAnswer struct {
	// From and To are the range answered, on whole minutes (UTC).
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// StepSeconds is the points' step: 60.
	StepSeconds int `json:"step_seconds"`
	// Points has one point per minute from From on, oldest first.
	Points []HistoryPoint `json:"points"`
}

// HistoryPoint is one minute's figures, merged across the instances that
// share the store. A minute nobody counted is present with empty maps
// and zero counts.
type HistoryPoint struct {
	// Minute is the start of the minute, UTC.
	Minute time.Time `json:"minute"`
	// Received is results received by callbacks_total's result label
	// (stored, duplicate, quarantined, poll_stored, ...), summed over the
	// instances.
	Received map[string]int64 `json:"received"`
	// Deliveries is forwards that ended by outcome (delivered, failed,
	// timeout, rejected, interrupted) and results parked (parked) or
	// expired for their max_age (expired), summed over the instances.
	Deliveries map[string]int64 `json:"deliveries"`
	// Backlog is records by state (every state but delivered) as the
	// store counted them at the end of the minute: the latest sample any
	// instance took; {} when none was taken.
	Backlog map[store.State]int64 `json:"backlog"`
	// DelayMs is the time from receipt to delivery of the minute's
	// deliveries, in milliseconds.
	DelayMs HistoryPercentiles `json:"delay_ms"`
	// AgeMs is the time from the task's submission (tracked tasks) or
	// else the receipt to delivery, in milliseconds.
	AgeMs HistoryPercentiles `json:"age_ms"`
}

// HistoryPercentiles summarise one minute's histogram: the number of
// durations and their estimated 50th and 95th percentiles in
// milliseconds, from the instances' bucket counts summed
// (store.HistoryQuantile: linear within a bucket of
// store.HistoryBoundsMs; 0 when Count is 0).
type HistoryPercentiles struct {
	Count int64   `json:"count"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
}

// NewHistoryAnswer builds the answer for [from, to) (whole minutes) from
// the minute records of every instance (any order; records outside the
// range are ignored).
func NewHistoryAnswer(from, to time.Time, minutes []store.HistoryMinute) HistoryAnswer {
	from, to = from.UTC(), to.UTC()
	n := max(0, int(to.Sub(from)/HistoryStep))
	byMinute := make([][]store.HistoryMinute, n)
	for _, m := range minutes {
		i := int(m.Minute.Sub(from) / HistoryStep)
		if m.Minute.Before(from) || i >= n {
			continue
		}
		byMinute[i] = append(byMinute[i], m)
	}
	ans := HistoryAnswer{From: from, To: to, StepSeconds: int(HistoryStep / time.Second), Points: make([]HistoryPoint, n)}
	for i, ms := range byMinute {
		m := store.MergeMinutes(ms)
		p := HistoryPoint{
			Minute:     from.Add(time.Duration(i) * HistoryStep),
			Received:   m.Received,
			Deliveries: m.Deliveries,
			Backlog:    m.Backlog,
			DelayMs:    percentiles(m.Delay),
			AgeMs:      percentiles(m.Age),
		}
		if p.Received == nil {
			p.Received = map[string]int64{}
		}
		if p.Deliveries == nil {
			p.Deliveries = map[string]int64{}
		}
		if p.Backlog == nil {
			p.Backlog = map[store.State]int64{}
		}
		ans.Points[i] = p
	}
	return ans
}

func percentiles(buckets []uint64) HistoryPercentiles {
	var n uint64
	for _, c := range buckets {
		n += c
	}
	round := func(ms float64) float64 { return math.Round(ms*1000) / 1000 }
	return HistoryPercentiles{
		Count: int64(n),
		P50:   round(store.HistoryQuantile(buckets, 0.5)),
		P95:   round(store.HistoryQuantile(buckets, 0.95)),
	}
}
