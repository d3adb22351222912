package store

import (
	"context"
	"maps"
	"sync"
)

// Counts is what a store holds, counted as it changes: reading them costs
// the number of providers and states, never a scan of the records (on
// PostgreSQL, of none but those in flight, StateForwarding).
type Counts struct {
	// Records counts stored results by provider, then state; states with
	// none are left out.
	Records map[string]map[State]int64 `json:"records"`
	// TasksPending counts tracked tasks in TaskPending, by provider.
	TasksPending map[string]int64 `json:"tasks_pending"`
	// TasksPendingByAccount counts the same tasks by provider, then
	// account id (Task.Account; "" for tasks stored without one): the
	// counts of a provider's accounts add up to its TasksPending.
	// Providers and accounts with none are left out.
	TasksPendingByAccount map[string]map[string]int64 `json:"tasks_pending_by_account"`
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
// (-1) a state, or a task of an account entering or leaving TaskPending
// (task set).
type countDelta struct {
	provider string
	account  string
	state    State
	task     bool
	n        int64
	// exp is, on Badger, the record's expiry (Unix seconds): the
	// change moves that second's expiry bucket of the state too
	// (badger_sweep.go). 0 for none.
	exp uint64
}

// memCounts are counts kept in memory (Badger's: read from the persisted
// counts when the store opens, then moved by each committed batch).
type memCounts struct {
	mu        sync.Mutex
	records   map[string]map[State]int64
	pending   map[string]int64
	byAccount map[string]map[string]int64
}

func newMemCounts() *memCounts {
	return &memCounts{records: map[string]map[State]int64{}, pending: map[string]int64{}, byAccount: map[string]map[string]int64{}}
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
			addCount(c.byAccount, d.provider, d.account, d.n)
			continue
		}
		addCount(c.records, d.provider, d.state, d.n)
	}
}

// addCount adds n to m[outer][inner], leaving out counts that reach 0 and
// inner maps left empty.
func addCount[K comparable](m map[string]map[K]int64, outer string, inner K, n int64) {
	in := m[outer]
	if in == nil {
		in = map[K]int64{}
		m[outer] = in
	}
	in[inner] += n
	if in[inner] <= 0 {
		delete(in, inner)
	}
	if len(in) == 0 {
		delete(m, outer)
	}
}

// record is the count of provider's records in state.
func (c *memCounts) record(provider string, state State) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.records[provider][state]
}

// snapshot copies the counts.
func (c *memCounts) snapshot() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Counts{Records: make(map[string]map[State]int64, len(c.records)), TasksPending: maps.Clone(c.pending),
		TasksPendingByAccount: make(map[string]map[string]int64, len(c.byAccount))}
	for p, m := range c.records {
		out.Records[p] = maps.Clone(m)
	}
	for p, m := range c.byAccount {
		out.TasksPendingByAccount[p] = maps.Clone(m)
	}
	return out
}
