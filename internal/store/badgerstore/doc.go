// Package badgerstore is the single-node [store.Store] on Badger v4, in the
// process.
//
// What it guarantees: a write is answered only after the fdatasync of the
// store's journal that covers it (the group commit's durable point); the
// journal is checkpointed into Badger later, and replayed at open after a
// crash, so a committed write survives a power loss. Indexes change in the
// same Badger transaction as the records they point to, counts and ages are
// kept in memory in step with each commit (and checked against Badger at
// open when [Options.SelfCheck] is on), and each open is a new lease owner,
// so a forward cut by a crash is claimable as soon as the store is open
// again. Writes are refused with [store.ErrUnavailable] while the
// filesystem has less free space than [Options.MinFreeSpace].
//
// What it relies on: one process per directory (Badger's directory lock);
// one committer goroutine writing (conflict detection is off); and two facts
// about Badger v4 that the journal's checkpoint depends on, since DB.Sync
// syncs only the active memtable's log and the value log: Badger's memtable
// logs and value logs end in .mem and .vlog, and a table is synced before
// the log it was flushed from is deleted. Both facts are pinned by tests.
// The journal (the store's durable point, apart from Badger's own files)
// and its checkpoint live apart from the rest of the store: the journal
// type and the syncBadgerFiles walk.
//
// The store's state (its counters, see [Counters]; its caches; its loops)
// belongs to the [Badger] value: two stores in one process share nothing.
package badgerstore
