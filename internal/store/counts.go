package store

import (
	"context"
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

// AddCount adds n to m[outer][inner], leaving out counts that reach 0 and
// inner maps left empty.
func AddCount[K comparable](m map[string]map[K]int64, outer string, inner K, n int64) {
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
