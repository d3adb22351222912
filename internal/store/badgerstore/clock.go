package badgerstore

import (
	"sync"

	"github.com/dgraph-io/badger/v4"
)

// The store opens Badger in managed mode (badger.OpenManaged) and hands
// out its transaction timestamps itself. In Badger's own mode every
// transaction takes its read timestamp from, and reports its commit to,
// two watermark goroutines, and each write transaction waits until the
// watermark has caught up with the one before it: three or four channel
// hand-offs per group commit and two per read, each of which waits for a
// free P (docs/benchmarks.md, "The tail: goroutines waiting for a P"). Here one
// writer at a time (the committer, or the open before it starts) commits,
// so a mutex and two counters do the same work in the caller's goroutine.
//
// Badger's versions: a transaction reading at ts sees every write committed
// at or below ts. Compaction keeps, of each key, every version above the
// discard timestamp and the newest one at or below it, so a reader at ts is
// safe while the discard timestamp is at most ts: readers are registered
// from their read timestamp to their end, and the discard timestamp never
// passes the oldest of them. It moves on after each commit and when the
// read holding it back ends (without it Badger would keep every version
// of every key forever; in Badger's own mode a compaction reads the oldest
// open read itself, so a purge's compaction right after a read ended must
// find the timestamp moved on too).

// clock hands out the store's read and commit timestamps.
type clock struct {
	mu      sync.Mutex
	next    uint64         // the next commit timestamp
	last    uint64         // the newest commit timestamp whose write completed
	reading map[uint64]int // read timestamps of open reads, counted
	discard uint64         // the discard timestamp last set
	// setDiscard gives Badger a new discard timestamp (SetDiscardTs),
	// called with mu held so that updates arrive in order; nil: none.
	setDiscard func(uint64)
}

// newClock starts a clock after the newest version the database holds
// (db.MaxVersion(): a database written in Badger's own mode is read the
// same way, and can be opened in that mode again). setDiscard may be nil.
func newClock(newest uint64, setDiscard func(uint64)) *clock {
	c := &clock{next: newest + 1, last: newest, reading: map[uint64]int{}, setDiscard: setDiscard}
	c.moveDiscard()
	return c
}

// beginRead returns the timestamp a read transaction reads at, registered
// until endRead.
func (c *clock) beginRead() uint64 {
	c.mu.Lock()
	ts := c.last
	c.reading[ts]++
	c.mu.Unlock()
	return ts
}

// endRead ends the read beginRead returned ts for.
func (c *clock) endRead(ts uint64) {
	c.mu.Lock()
	if c.reading[ts]--; c.reading[ts] <= 0 {
		delete(c.reading, ts)
		if ts == c.discard && c.discard < c.last {
			c.moveDiscard()
		}
	}
	c.mu.Unlock()
}

// beginWrite returns a write transaction's read timestamp (every completed
// commit) and its commit timestamp. A commit timestamp is never handed out
// twice, even if its commit fails (it may have written part of its batch).
// One writer at a time: the writer's read need not be registered, as the
// discard timestamp never passes last, which only its own commit moves.
func (c *clock) beginWrite() (read, commit uint64) {
	c.mu.Lock()
	read, commit = c.last, c.next
	c.next++
	c.mu.Unlock()
	return read, commit
}

// committed records that the write at commit completed: reads begun from
// now on see it. It returns the discard timestamp.
func (c *clock) committed(commit uint64) (discard uint64) {
	c.mu.Lock()
	c.last = max(c.last, commit)
	c.moveDiscard()
	discard = c.discard
	c.mu.Unlock()
	return discard
}

// moveDiscard sets the discard timestamp to the oldest open read, or to
// last if none is open. c.mu is held.
func (c *clock) moveDiscard() {
	d := c.last
	for ts := range c.reading {
		d = min(d, ts)
	}
	if d == c.discard {
		return
	}
	c.discard = d
	if c.setDiscard != nil {
		c.setDiscard(d)
	}
}

// badgerDB is the store's Badger database, opened in managed mode, with
// its clock.
type badgerDB struct {
	*badger.DB
	clk *clock
}

// openManaged opens Badger in managed mode and starts its clock.
func openManaged(opts badger.Options) (badgerDB, error) {
	db, err := badger.OpenManaged(opts)
	if err != nil {
		return badgerDB{}, err
	}
	return badgerDB{DB: db, clk: newClock(db.MaxVersion(), db.SetDiscardTs)}, nil
}

// View runs fn in a read transaction that sees every completed commit.
func (d badgerDB) View(fn func(txn *badger.Txn) error) error {
	if d.IsClosed() {
		return badger.ErrDBClosed
	}
	ts := d.clk.beginRead()
	defer d.clk.endRead(ts)
	txn := d.NewTransactionAt(ts, false)
	defer txn.Discard()
	return fn(txn)
}

// Update runs fn in a write transaction and commits it. The committer is
// the store's writer; Update is for the open, before the committer starts,
// and for tests. Never while another write runs: its commit would move
// last past a write at a lower timestamp still being written.
func (d badgerDB) Update(fn func(txn *badger.Txn) error) error {
	if d.IsClosed() {
		return badger.ErrDBClosed
	}
	txn, commit := d.begin()
	defer txn.Discard()
	if err := fn(txn); err != nil {
		return err
	}
	return d.commit(txn, commit)
}

// begin starts a write transaction; commit commits it at its timestamp.
func (d badgerDB) begin() (*badger.Txn, uint64) {
	read, commit := d.clk.beginWrite()
	return d.NewTransactionAt(read, true), commit
}

// commit commits txn at commit and, once it is written, lets reads see it
// (and moves Badger's discard timestamp).
func (d badgerDB) commit(txn *badger.Txn, commit uint64) error {
	if err := txn.CommitAt(commit, nil); err != nil {
		return err
	}
	d.clk.committed(commit)
	return nil
}
