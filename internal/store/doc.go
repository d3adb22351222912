// Package store is the contract of the durable storage behind the pingback
// plugin, without an implementation: the Store interface, the record and
// task types, the queries and their pages, the counts and ages, the errors,
// the helpers both drivers share, and the group commit ([Committer]) both
// drivers run. The drivers live in their own packages: badgerstore (one
// node, Badger in the process) and pgstore (PostgreSQL, shared by several
// Caddy instances); storetest is the conformance suite both pass.
//
// The package holds no mutable state of its own (every counter, cache and
// lock belongs to a driver's store value, each Committer to the store that
// runs it) and relies on the standard library alone.
//
// The Store interface is the contract every backend meets (and that a
// store shared by several Caddy instances can meet too): a write returns
// success only after it is durably committed; an answer ("stored",
// "duplicate", the record after an update) is given only if what it speaks
// of is committed; deduplication is atomic with the write of the record;
// and the indexes the loops scan (due retries, leases, poll times, expiry
// watch) change in the same transaction as the records they point to.
//
// Ownership of a delivery is a lease: a record in state forwarding names
// the store handle (the owner) whose process forwards it and until when.
// While the lease holds, nothing else starts a delivery of the record.
// A lease lapses at its Until, or at once when its owner is gone (on
// Badger: every handle that opened the store before this one), and the
// record is then claimable.
//
// Accounts. A tracked task remembers the account it was submitted with
// (Task.Account: an account id the root package derives from the API key;
// the store never sees a key). The poller's reads are per account
// (DueTasks answers the due tasks of the accounts it is given and reads
// no other's), as are the pending counts (Counts.TasksPendingByAccount)
// and, on a shared store, the poll budget and rate limit (SharedPolling).
// Tasks stored before accounts (Badger format 6, PostgreSQL schema 8) are
// stamped once, when the store is upgraded, with the account the app
// names for their provider (BadgerOptions.LegacyAccounts,
// PostgresOptions.LegacyAccounts).
//
// Transient faults. PostgreSQL retries an insert, a delivery update and a
// claim once, on a newly dialled connection, after a connection-level
// error (SQLSTATE class 08, 57P01, 57P02, 57P03, 57P05, EOF, a reset or
// closed connection; an insert only within its context's deadline); a
// connection lost after COMMIT counts as committed if the database says
// the transaction did (pgstore). Badger has no transient
// error in that sense, so it retries nothing: it runs in the process,
// conflict detection is off and one committer writes (no ErrConflict),
// ErrTxnTooBig splits the batch, the DropPrefix that blocks writes runs in
// the committer (no ErrBlockedWrites), and a failed write or fsync of the
// journal or value log (ENOSPC, EIO) must not be retried: after a failed
// fsync the kernel may have dropped the dirty pages, so a second fsync
// that succeeds proves nothing.
package store
