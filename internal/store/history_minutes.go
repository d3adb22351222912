package store

import (
	"context"
	"maps"
	"slices"
	"time"
)

// HistoryBoundsMs are the upper bounds, in milliseconds, of the buckets
// of a minute's delay and age histograms (HistoryMinute.Delay, Age): a
// duration d falls in the first bucket whose bound is at least d, and
// beyond the last bound in one more, unbounded bucket. The bounds are
// part of the stored format (every instance and every stored minute
// counts into the same buckets, so that buckets merge by summing): they
// may only ever be appended to.
var HistoryBoundsMs = []float64{
	1, 2.5, 5, 10, 25, 50, 100, 250, 500, // live forwards
	1000, 2500, 5000, 10000, 30000, 60000, 120000, 300000, 600000, // replays
	1800000, 3600000, 10800000, 21600000, 86400000, // 30 min .. a day
}

// HistoryBuckets is the number of buckets of a minute's histogram: one
// per bound of HistoryBoundsMs, and one beyond the last.
var HistoryBuckets = len(HistoryBoundsMs) + 1

// HistoryBucket is the index of the bucket of duration d (negative: the
// first).
func HistoryBucket(d time.Duration) int {
	ms := float64(d) / float64(time.Millisecond)
	i, _ := slices.BinarySearch(HistoryBoundsMs, ms)
	return i
}

// HistoryMinute is what one instance saw in one minute: written once a
// minute (and at close, the minute so far) by HistoryStore.WriteMinute.
type HistoryMinute struct {
	// Minute is the start of the minute, UTC, on a whole minute.
	Minute time.Time `json:"-"`
	// Instance names the process that counted the figures (its store
	// handle's Owner).
	Instance string `json:"-"`
	// Received is the results received, by callbacks_total's result label
	// (stored, duplicate, quarantined, poll_stored, ...).
	Received map[string]int64 `json:"received,omitempty"`
	// Deliveries is the forwards that ended, by outcome (delivered,
	// failed, timeout, rejected, interrupted), plus the results parked
	// (parked) and expired for their max_age (expired).
	Deliveries map[string]int64 `json:"deliveries,omitempty"`
	// Backlog is the records by state (every state but delivered) as the
	// store counted them when the minute ended (at SampledAt); nil when
	// no sample was taken.
	Backlog map[State]int64 `json:"backlog,omitempty"`
	// SampledAt is when Backlog was read; of several instances' samples
	// of one minute, the latest is the minute's.
	SampledAt time.Time `json:"sampled_at,omitzero"`
	// Delay and Age count the minute's deliveries by bucket of
	// HistoryBoundsMs (HistoryBuckets long, or empty for none): Delay
	// from receipt to delivery, Age from the task's submission (tracked
	// tasks) or else the receipt to delivery.
	Delay []uint64 `json:"delay,omitempty"`
	Age   []uint64 `json:"age,omitempty"`
}

// HistoryStore keeps the per-minute figures of the history, one record
// per instance and minute, apart from the results: their number does not
// depend on the number of records stored.
type HistoryStore interface {
	// WriteMinute durably stores m under (m.Minute, m.Instance),
	// replacing what was stored there (a re-write of the minute).
	WriteMinute(ctx context.Context, m HistoryMinute) error
	// Minutes returns the records of the minutes in [from, to), every
	// instance's, ordered by minute and then instance.
	Minutes(ctx context.Context, from, to time.Time) ([]HistoryMinute, error)
	// PruneMinutes deletes the records of the minutes before before and
	// returns how many it deleted.
	PruneMinutes(ctx context.Context, before time.Time) (int, error)
}

// MergeMinutes merges the records of one minute from several instances:
// counts and bucket counts are summed, and the backlog is the latest
// sample (by SampledAt). The result has no Instance.
func MergeMinutes(ms []HistoryMinute) HistoryMinute {
	var out HistoryMinute
	for _, m := range ms {
		out.Minute = m.Minute
		out.Received = addCounts(out.Received, m.Received)
		out.Deliveries = addCounts(out.Deliveries, m.Deliveries)
		out.Delay = addBuckets(out.Delay, m.Delay)
		out.Age = addBuckets(out.Age, m.Age)
		if m.Backlog != nil && (out.Backlog == nil || m.SampledAt.After(out.SampledAt)) {
			out.Backlog, out.SampledAt = maps.Clone(m.Backlog), m.SampledAt
		}
	}
	return out
}

func addCounts[K comparable](to, from map[K]int64) map[K]int64 {
	for k, n := range from {
		if to == nil {
			to = map[K]int64{}
		}
		to[k] += n
	}
	return to
}

func addBuckets(to, from []uint64) []uint64 {
	if len(from) == 0 {
		return to
	}
	if len(to) < len(from) {
		to = append(to, make([]uint64, len(from)-len(to))...)
	}
	for i, n := range from {
		to[i] += n
	}
	return to
}

// HistoryQuantile estimates the q-quantile (0 < q ≤ 1), in milliseconds,
// of the durations counted in buckets (by HistoryBoundsMs), the way
// Prometheus' histogram_quantile does: it finds the bucket where the
// q·count-th duration lies and interpolates linearly between the bucket's
// bounds (the first bucket starts at 0); in the unbounded last bucket it
// answers the last bound. It returns 0 for no durations.
func HistoryQuantile(buckets []uint64, q float64) float64 {
	var total uint64
	for _, n := range buckets {
		total += n
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var below uint64
	for i, n := range buckets {
		if n == 0 || float64(below+n) < rank {
			below += n
			continue
		}
		if i >= len(HistoryBoundsMs) {
			return HistoryBoundsMs[len(HistoryBoundsMs)-1]
		}
		lower := 0.0
		if i > 0 {
			lower = HistoryBoundsMs[i-1]
		}
		return lower + (HistoryBoundsMs[i]-lower)*(rank-float64(below))/float64(n)
	}
	return HistoryBoundsMs[len(HistoryBoundsMs)-1]
}
