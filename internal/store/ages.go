package store

import (
	"time"
)

// Ages are the times behind the age gauges, by provider: what a store
// keeps as it changes (Badger: in memory, rebuilt when it opens) or finds
// through an index (PostgreSQL: database-wide), never by scanning the
// records. Providers with nothing to age are left out.
type Ages struct {
	// OldestPendingTask is the submission time of the oldest tracked task
	// still pending.
	OldestPendingTask map[string]time.Time `json:"oldest_pending_task"`
	// OldestUndelivered is the received time of the oldest result in
	// state failed or forwarding: the retry backlog.
	OldestUndelivered map[string]time.Time `json:"oldest_undelivered"`
	// LastCallback is the received time of the newest live pingback
	// stored (Source callback; not duplicates, not polled results), kept
	// when that record is gone.
	LastCallback map[string]time.Time `json:"last_callback"`
}
