package store

import (
	"context"
	"maps"
	"sync"
)

// Counts is what a store holds, counted as it changes: reading them costs
// the number of providers and states, never a scan of the records.
type Counts struct {
	// Records counts stored results by provider, then state; states with
	// none are left out.
	Records map[string]map[State]int64 `json:"records"`
	// TasksPending counts tracked tasks in TaskPending, by provider.
	TasksPending map[string]int64 `json:"tasks_pending"`
}

// Counter is the part of the Store contract that counts: the counts change
// in the same transactions as the records and tasks they count.
type Counter interface {
	// Counts returns the current counts. On a store shared by several
	// instances they are database-wide, the same on every instance.
	Counts(ctx context.Context) (Counts, error)
	// Ages returns the times behind the age gauges (see Ages). On a
	// store shared by several instances they are database-wide.
	Ages(ctx context.Context) (Ages, error)
}

// countDelta is one change of a count: a record entering (+1) or leaving
// (-1) a state, or a task entering or leaving TaskPending (task set).
type countDelta struct {
	provider string
	state    State
	task     bool
	n        int64
}

// memCounts are counts kept in memory (Badger's: rebuilt from the keys
// when the store opens, then moved by each committed batch).
type memCounts struct {
	mu      sync.Mutex
	records map[string]map[State]int64
	pending map[string]int64
}

func newMemCounts() *memCounts {
	return &memCounts{records: map[string]map[State]int64{}, pending: map[string]int64{}}
}

// apply adds the deltas of a committed batch.
func (c *memCounts) apply(ds []countDelta) {
	if c == nil || len(ds) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range ds {
		if d.task {
			c.pending[d.provider] += d.n
			if c.pending[d.provider] <= 0 {
				delete(c.pending, d.provider)
			}
			continue
		}
		m := c.records[d.provider]
		if m == nil {
			m = map[State]int64{}
			c.records[d.provider] = m
		}
		m[d.state] += d.n
		if m[d.state] <= 0 {
			delete(m, d.state)
		}
		if len(m) == 0 {
			delete(c.records, d.provider)
		}
	}
}

// snapshot copies the counts.
func (c *memCounts) snapshot() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Counts{Records: make(map[string]map[State]int64, len(c.records)), TasksPending: maps.Clone(c.pending)}
	for p, m := range c.records {
		out.Records[p] = maps.Clone(m)
	}
	return out
}
