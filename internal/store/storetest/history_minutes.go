package storetest

import (
	"reflect"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// testHistoryMinutes checks the store.HistoryStore contract: a minute
// record reads back as written, a re-write of (minute, instance) replaces
// it, two instances' records of one minute are both kept, Minutes answers
// [from, to) in minute and instance order, the records survive a restart,
// and PruneMinutes deletes exactly those before its time.
func testHistoryMinutes(t *testing.T, h Harness) {
	s := h.Open(t)
	hs, ok := s.(store.HistoryStore)
	if !ok {
		t.Fatalf("%T is not a store.HistoryStore", s)
	}
	t0 := base().Truncate(time.Minute)
	buckets := func(i int, n uint64) []uint64 {
		b := make([]uint64, store.HistoryBuckets)
		b[i] = n
		return b
	}
	minute := func(i int, inst string, n int64) store.HistoryMinute {
		return store.HistoryMinute{
			Minute: t0.Add(time.Duration(i) * time.Minute), Instance: inst,
			Received:   map[string]int64{"stored": n, "duplicate": 1},
			Deliveries: map[string]int64{"delivered": n},
			Backlog:    map[store.State]int64{store.StateFailed: n},
			SampledAt:  t0.Add(time.Duration(i+1) * time.Minute),
			Delay:      buckets(3, uint64(n)),
			Age:        buckets(store.HistoryBuckets-1, uint64(n)),
		}
	}
	write := func(hs store.HistoryStore, m store.HistoryMinute) {
		t.Helper()
		if err := hs.WriteMinute(ctx, m); err != nil {
			t.Fatalf("WriteMinute(%s, %s): %v", fmtTime(m.Minute), m.Instance, err)
		}
	}
	want := []store.HistoryMinute{minute(0, "a", 5), minute(0, "b", 7), minute(1, "a", 9), minute(3, "a", 2)}
	write(hs, minute(0, "a", 1)) // replaced below
	for _, m := range want {
		write(hs, m)
	}
	write(hs, minute(4, "a", 3)) // past `to`
	check := func(hs store.HistoryStore, what string, from, to time.Time, want []store.HistoryMinute) {
		t.Helper()
		got, err := hs.Minutes(ctx, from, to)
		if err != nil {
			t.Fatalf("%s: Minutes: %v", what, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: Minutes gave %d records, want %d: %+v", what, len(got), len(want), got)
		}
		for i := range want {
			g, w := got[i], want[i]
			if !g.Minute.Equal(w.Minute) || g.Instance != w.Instance || !g.SampledAt.Equal(w.SampledAt) {
				t.Errorf("%s: record %d is %s/%s sampled %s, want %s/%s sampled %s", what, i,
					fmtTime(g.Minute), g.Instance, fmtTime(g.SampledAt), fmtTime(w.Minute), w.Instance, fmtTime(w.SampledAt))
			}
			g.Minute, g.SampledAt, w.Minute, w.SampledAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if !reflect.DeepEqual(g, w) {
				t.Errorf("%s: record %d\n got %+v\nwant %+v", what, i, g, w)
			}
		}
	}
	check(hs, "written", t0, t0.Add(4*time.Minute), want)
	check(hs, "from inside a minute", t0.Add(30*time.Second), t0.Add(4*time.Minute), want[2:])
	check(hs, "to inside a minute", t0, t0.Add(90*time.Second), want[:3])

	if h.Reopen != nil {
		s = h.Reopen(t, s)
		hs = s.(store.HistoryStore)
		check(hs, "after a restart", t0, t0.Add(4*time.Minute), want)
	}

	n, err := hs.PruneMinutes(ctx, t0.Add(time.Minute))
	if err != nil || n != 2 {
		t.Fatalf("PruneMinutes(minute 1) = %d, %v; want 2 (minute 0 of a and b)", n, err)
	}
	check(hs, "pruned", t0.Add(-time.Hour), t0.Add(time.Hour), append(want[2:], minute(4, "a", 3)))
}
