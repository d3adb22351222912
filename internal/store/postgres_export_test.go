package store

import "time"

// SetPostgresClock makes p measure due times and leases by clock instead
// of the database's now(), for the conformance suite's injected times.
func SetPostgresClock(p *Postgres, clock func() time.Time) { p.clock = clock }

// PostgresFairClaimQuery is the query of a chunk of the claim's fair pass
// (after: a later chunk), its parameters as pgClaimPass.query says.
func PostgresFairClaimQuery(after bool) string { return pgFairPass.query(after) }
