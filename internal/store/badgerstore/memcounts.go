package badgerstore

import (
	"maps"
	"sync"

	"github.com/caddy-pingback/pingback/internal/store"
)

// countDelta is one change of a count: a record entering (+1) or leaving
// (-1) a state, or a task of an account entering or leaving TaskPending
// (task set).
type countDelta struct {
	provider string
	account  string
	state    store.State
	task     bool
	n        int64
	// exp is, on Badger, the record's expiry (Unix seconds): the
	// change moves that second's expiry bucket of the state too
	// ([bucketPrefix]). 0 for none.
	exp uint64
}

// memCounts are counts kept in memory (Badger's: read from the persisted
// counts when the store opens, then moved by each committed batch).
type memCounts struct {
	mu        sync.Mutex
	records   map[string]map[store.State]int64
	pending   map[string]int64
	byAccount map[string]map[string]int64
}

func newMemCounts() *memCounts {
	return &memCounts{records: map[string]map[store.State]int64{}, pending: map[string]int64{}, byAccount: map[string]map[string]int64{}}
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
			store.AddCount(c.byAccount, d.provider, d.account, d.n)
			continue
		}
		store.AddCount(c.records, d.provider, d.state, d.n)
	}
}

// record is the count of provider's records in state.
func (c *memCounts) record(provider string, state store.State) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.records[provider][state]
}

// snapshot copies the counts.
func (c *memCounts) snapshot() store.Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := store.Counts{Records: make(map[string]map[store.State]int64, len(c.records)), TasksPending: maps.Clone(c.pending),
		TasksPendingByAccount: make(map[string]map[string]int64, len(c.byAccount))}
	for p, m := range c.records {
		out.Records[p] = maps.Clone(m)
	}
	for p, m := range c.byAccount {
		out.TasksPendingByAccount[p] = maps.Clone(m)
	}
	return out
}
