package store

import (
	"fmt"
	"testing"

	"github.com/dgraph-io/badger/v4"
)

func TestClock(t *testing.T) {
	for _, tc := range []struct {
		name            string
		run             func(c *clock) (read, discard uint64)
		wantRead, wantD uint64
	}{
		{"a read sees a completed commit, and the discard timestamp reaches it", func(c *clock) (uint64, uint64) {
			_, ts := c.beginWrite()
			d := c.committed(ts)
			r := c.beginRead()
			c.endRead(r)
			return r, d
		}, 11, 11},
		{"a read does not see a commit still being written", func(c *clock) (uint64, uint64) {
			_, ts := c.beginWrite()
			r := c.beginRead()
			c.endRead(r)
			return r, c.committed(ts)
		}, 10, 11},
		{"an open read holds the discard timestamp back", func(c *clock) (uint64, uint64) {
			r := c.beginRead()
			_, ts := c.beginWrite()
			d := c.committed(ts)
			c.endRead(r)
			return r, d
		}, 10, 10},
		{"the discard timestamp moves on once the read ends", func(c *clock) (uint64, uint64) {
			r := c.beginRead()
			_, ts := c.beginWrite()
			c.committed(ts)
			c.endRead(r)
			_, ts = c.beginWrite()
			return r, c.committed(ts)
		}, 10, 12},
		{"a failed commit's timestamp is not handed out again", func(c *clock) (uint64, uint64) {
			c.beginWrite() // its commit fails: committed is never called
			read, ts := c.beginWrite()
			return read, c.committed(ts)
		}, 10, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClock(10)
			read, disc := tc.run(c)
			if read != tc.wantRead || disc != tc.wantD {
				t.Errorf("read at %d, discard %d; want %d, %d", read, disc, tc.wantRead, tc.wantD)
			}
			if len(c.reading) != 0 {
				t.Errorf("%d read timestamps still registered after every read ended", len(c.reading))
			}
		})
	}
}

// The store writes Badger in managed mode: a read open across many
// overwrites of a key keeps its snapshot even through a compaction (the
// discard timestamp waits for it), the old versions may go once it ends,
// and a store reopened (a new clock, started at the newest version) reads
// and writes on top of what is there.
func TestManagedVersions(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, BadgerOptions{Dir: dir})
	mustInsert(t, b, testRecord("a", StateForwarding))
	if _, err := b.UpdateDelivery(ctx, key("a"), delivered); err != nil {
		t.Fatal(err)
	}
	snap := b.db.clk.beginRead()
	old := b.db.NewTransactionAt(snap, false)
	for range 50 {
		if _, err := b.UpdateDelivery(ctx, key("a"), delivered); err != nil {
			t.Fatal(err)
		}
	}
	// Flush the memtables to tables (DropPrefix of a key that is there
	// does) and compact them: compaction drops versions at or below the
	// discard timestamp that a newer one hides.
	if err := b.db.Update(func(txn *badger.Txn) error { return txn.Set([]byte("zz/drop"), nil) }); err != nil {
		t.Fatal(err)
	}
	if err := b.db.DropPrefix([]byte("zz/")); err != nil {
		t.Fatal(err)
	}
	if err := b.db.Flatten(1); err != nil {
		t.Fatal(err)
	}
	item, err := old.Get(deliveryKey(key("a")))
	if err != nil {
		t.Fatalf("snapshot read after 50 commits and a compaction: %v", err)
	}
	if item.Version() > snap {
		t.Errorf("snapshot read at %d got version %d", snap, item.Version())
	}
	old.Discard()
	b.db.clk.endRead(snap)
	last := b.db.clk.last
	if d := b.db.clk.committed(last); d != last {
		t.Errorf("discard timestamp %d after the read ended, want the last commit %d", d, last)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b = openTestBadger(t, BadgerOptions{Dir: dir})
	if b.db.clk.last < last {
		t.Errorf("reopened clock at %d, below the newest commit %d of the last open", b.db.clk.last, last)
	}
	if r := mustGet(t, b, key("a")); r.State != StateDelivered {
		t.Errorf("after reopen: state %s, want %s", r.State, StateDelivered)
	}
	mustInsert(t, b, testRecord("b", StateForwarding))
	mustGet(t, b, key("b"))
}

// A store written by Badger in its own mode (earlier versions of the
// plugin) opens in managed mode with everything visible, and its files
// open in Badger's own mode again.
func TestManagedOpensUnmanagedStore(t *testing.T) {
	dir := t.TempDir()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := db.Update(func(txn *badger.Txn) error {
			return txn.Set(fmt.Appendf(nil, "x/%d", i), []byte("v"))
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	m, err := openManaged(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.View(func(txn *badger.Txn) error {
		_, err := txn.Get([]byte("x/19"))
		return err
	}); err != nil {
		t.Errorf("managed read of an unmanaged store's last write: %v", err)
	}
	if err := m.Update(func(txn *badger.Txn) error { return txn.Set([]byte("x/20"), []byte("v")) }); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(txn *badger.Txn) error {
		_, err := txn.Get([]byte("x/20"))
		return err
	}); err != nil {
		t.Errorf("unmanaged read of the managed write: %v", err)
	}
}
