package badgerstore

import (
	"maps"
	"sync"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// inBacklog reports whether a record in state s counts in
// Ages.OldestUndelivered.
func inBacklog(s store.State) bool { return s == store.StateFailed || s == store.StateForwarding }

// secondCounts counts times to the second, and knows the earliest.
type secondCounts struct {
	n     map[int64]int64
	min   int64
	dirty bool // min must be looked for again
}

func (c *secondCounts) add(sec, n int64) {
	c.n[sec] += n
	if c.n[sec] <= 0 {
		delete(c.n, sec)
		if sec == c.min {
			c.dirty = true
		}
		return
	}
	if !c.dirty && (len(c.n) == 1 || sec < c.min) {
		c.min = sec
	}
}

// earliest is the earliest time counted, false if none.
func (c *secondCounts) earliest() (int64, bool) {
	if len(c.n) == 0 {
		return 0, false
	}
	if c.dirty {
		first := true
		for s := range c.n {
			if first || s < c.min {
				c.min, first = s, false
			}
		}
		c.dirty = false
	}
	return c.min, true
}

// ageKind says which age an ageDelta moves.
type ageKind uint8

const (
	agePending ageKind = iota
	ageBacklog
)

// ageDelta is a task entering (+1) or leaving (-1) TaskPending at its
// submission second, or a record entering or leaving the backlog (failed
// or forwarding), whose received second the tracker keeps by key.
type ageDelta struct {
	kind ageKind
	key  store.Key
	sec  int64 // agePending: the submission second; ageBacklog: the received second, on entering
	n    int64
}

// memAges are Ages kept in memory (Badger's): moved by each committed
// batch, rebuilt when the store opens. The backlog is kept by key (a
// record leaving it is found without reading it): memory in proportion to
// the results in state failed or forwarding.
type memAges struct {
	mu      sync.Mutex
	pending map[string]*secondCounts
	backlog map[string]*secondCounts
	inBack  map[store.Key]int64 // received second of each record in the backlog
	last    map[string]time.Time
}

func newMemAges() *memAges {
	return &memAges{pending: map[string]*secondCounts{}, backlog: map[string]*secondCounts{},
		inBack: map[store.Key]int64{}, last: map[string]time.Time{}}
}

func counted(m map[string]*secondCounts, provider string) *secondCounts {
	c := m[provider]
	if c == nil {
		c = &secondCounts{n: map[int64]int64{}}
		m[provider] = c
	}
	return c
}

// apply adds the deltas and live pingbacks of a committed batch.
func (a *memAges) apply(ds []ageDelta, live map[string]time.Time) {
	if a == nil || len(ds)+len(live) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range ds {
		switch d.kind {
		case agePending:
			counted(a.pending, d.key.Provider).add(d.sec, d.n)
		case ageBacklog:
			sec, in := a.inBack[d.key]
			switch {
			case d.n > 0 && !in:
				a.inBack[d.key] = d.sec
				counted(a.backlog, d.key.Provider).add(d.sec, 1)
			case d.n < 0 && in:
				delete(a.inBack, d.key)
				counted(a.backlog, d.key.Provider).add(sec, -1)
			}
		}
	}
	for p, t := range live {
		if t.After(a.last[p]) {
			a.last[p] = t
		}
	}
}

// lastLive is the newest live pingback of provider counted so far.
func (a *memAges) lastLive(provider string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last[provider]
}

// snapshot returns the current ages.
func (a *memAges) snapshot() store.Ages {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := store.Ages{OldestPendingTask: map[string]time.Time{}, OldestUndelivered: map[string]time.Time{},
		LastCallback: maps.Clone(a.last)}
	for _, x := range []struct {
		from map[string]*secondCounts
		to   map[string]time.Time
	}{{a.pending, out.OldestPendingTask}, {a.backlog, out.OldestUndelivered}} {
		for p, c := range x.from {
			if s, ok := c.earliest(); ok {
				x.to[p] = time.Unix(s, 0).UTC()
			}
		}
	}
	return out
}
