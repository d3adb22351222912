// Package pgstore is the [store.Store] on PostgreSQL, shared by any number
// of Caddy instances.
//
// What it guarantees: every write is one transaction answered after COMMIT,
// which with synchronous_commit on (checked per transaction; a store whose
// commits are not durable is refused, see [NotDurableError]) returns after
// the WAL is flushed. Concurrent operations are group-committed by a few
// committers ([store.Committer]); claims take rows with FOR UPDATE SKIP
// LOCKED, so instances never claim the same record, and leases are measured
// by the database's clock. After a connection-level fault an insert, a
// delivery update and a claim are retried once on a new connection, and a
// connection lost after COMMIT counts as committed if the database says the
// transaction did. The schema is migrated at open from the embedded
// migrations, one instance at a time under an advisory lock.
//
// What it relies on: PostgreSQL with synchronous_commit on and fsync on (fsync
// off is logged at error level, not refused); a role that may use the store's schema; and, behind a
// transaction pooler (PgBouncer), nothing that needs a session: every
// statement runs in a transaction that sets its own search_path, and no
// named prepared statement is used unless the DSN asks.
//
// The store's state (its pool, committers and clock) belongs to the
// [Postgres] value.
package pgstore
