package badgerstore

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"

	"github.com/caddy-pingback/pingback/internal/testfs"
)

func TestClock(t *testing.T) {
	for _, tc := range []struct {
		name string
		// run returns the read timestamp it checks
		run      func(c *clock) uint64
		wantRead uint64
		// the discard timestamp Badger was given last
		wantDiscard uint64
	}{
		{"a read sees a completed commit, and the discard timestamp reaches it", func(c *clock) uint64 {
			_, ts := c.beginWrite()
			c.committed(ts)
			r := c.beginRead()
			c.endRead(r)
			return r
		}, 11, 11},
		{"a read does not see a commit still being written", func(c *clock) uint64 {
			_, ts := c.beginWrite()
			r := c.beginRead()
			c.endRead(r)
			c.committed(ts)
			return r
		}, 10, 11},
		{"an open read holds the discard timestamp back", func(c *clock) uint64 {
			r := c.beginRead()
			_, ts := c.beginWrite()
			c.committed(ts)
			return r
		}, 10, 10},
		{"the discard timestamp moves on when the read holding it back ends", func(c *clock) uint64 {
			r := c.beginRead()
			_, ts := c.beginWrite()
			c.committed(ts)
			c.endRead(r)
			return r
		}, 10, 11},
		{"an older read still holds it when a newer one ends", func(c *clock) uint64 {
			r := c.beginRead()
			_, ts := c.beginWrite()
			c.committed(ts)
			r2 := c.beginRead()
			_, ts = c.beginWrite()
			c.committed(ts)
			c.endRead(r2)
			return r
		}, 10, 10},
		{"a failed commit's timestamp is not handed out again", func(c *clock) uint64 {
			c.beginWrite() // its commit fails: committed is never called
			read, ts := c.beginWrite()
			c.committed(ts)
			if ts != 12 {
				return ts
			}
			return read
		}, 10, 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var set []uint64
			c := newClock(10, func(ts uint64) { set = append(set, ts) })
			read := tc.run(c)
			if read != tc.wantRead {
				t.Errorf("read at %d, want %d", read, tc.wantRead)
			}
			if len(set) == 0 || set[len(set)-1] != tc.wantDiscard {
				t.Errorf("discard timestamps set %v, want the last %d", set, tc.wantDiscard)
			}
			for i := 1; i < len(set); i++ {
				if set[i] < set[i-1] {
					t.Errorf("discard timestamp went back: %v", set)
				}
			}
		})
	}
}

// A read of the store (b.view) open across many commits of one key keeps
// its snapshot through a memtable flush and a compaction: the discard
// timestamp waits for it. A store reopened (a new clock, started at the
// newest version) reads and writes on top of what is there.
func TestManagedViewKeepsItsSnapshot(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	mustInsert(t, b, testRecord("a", store.StateForwarding))
	if _, err := b.UpdateDelivery(ctx, key("a"), delivered); err != nil {
		t.Fatal(err)
	}
	inView, check, done := make(chan struct{}), make(chan struct{}), make(chan error)
	go func() {
		done <- b.view(func(txn *badger.Txn) error {
			close(inView)
			<-check
			item, err := txn.Get(deliveryKey(key("a")))
			if err == nil && item.Version() > txn.ReadTs() {
				return fmt.Errorf("version %d above the read's %d", item.Version(), txn.ReadTs())
			}
			return err
		})
	}()
	<-inView
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
	close(check)
	if err := <-done; err != nil {
		t.Fatalf("a read open across 50 commits and a compaction: %v", err)
	}
	last := b.db.clk.last
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	b = openTestBadger(t, Options{Dir: dir})
	if b.db.clk.last < last {
		t.Errorf("reopened clock at %d, below the newest commit %d of the last open", b.db.clk.last, last)
	}
	if r := mustGet(t, b, key("a")); r.State != store.StateDelivered {
		t.Errorf("after reopen: state %s, want %s", r.State, store.StateDelivered)
	}
	mustInsert(t, b, testRecord("b", store.StateForwarding))
	mustGet(t, b, key("b"))
}

// Concurrent reads see whole commits only: each checks that the indexes
// agree with the records while the committer moves records between states.
func TestManagedViewsSeeWholeCommits(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	var recs []*store.Record
	for i := range 20 {
		recs = append(recs, testRecord(hex.EncodeToString([]byte{byte(i)}), store.StateForwarding))
	}
	mustInsert(t, b, recs...)
	var stop atomic.Bool
	var readers sync.WaitGroup
	var bad atomic.Value
	for range 4 {
		readers.Go(func() {
			for !stop.Load() {
				if err := b.view(func(txn *badger.Txn) error { return checkIndexes(txn) }); err != nil {
					bad.Store(err)
					return
				}
			}
		})
	}
	states := []store.State{store.StateDelivered, store.StateParked, store.StateFailed, store.StateForwarding}
	for i := range 200 {
		var writers sync.WaitGroup
		for _, r := range recs {
			writers.Go(func() {
				if _, err := b.UpdateDelivery(ctx, r.Key(), func(d *store.Delivery) error {
					d.State, d.Lease = states[i%len(states)], store.Lease{}
					if d.State == store.StateFailed {
						d.DueAt = t0.Add(time.Duration(i) * time.Second)
					}
					return nil
				}); err != nil {
					t.Error(err)
				}
			})
		}
		writers.Wait()
		if bad.Load() != nil {
			break
		}
	}
	stop.Store(true)
	readers.Wait()
	if err, _ := bad.Load().(error); err != nil {
		t.Fatal(err)
	}
}

// A read open across a purge's delete that ends just after the scrub's
// commit (before its compaction) must not keep the purged bytes in the
// tables: the discard timestamp moves on when that read ends, not only at
// the next commit.
func TestPurgeErasesAfterAnOverlappingReadEnds(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	rnd := make([]byte, 12)
	_, _ = rand.Read(rnd)
	marker := []byte("ERASE-ME-" + hex.EncodeToString(rnd))
	gone := testRecord("42", store.StateParked)
	gone.Request.Body = append([]byte("id=42&code="), marker...)
	mustInsert(t, b, gone)
	// Reopen, so that the record is in a table (Close flushes).
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTestBadger(t, Options{Dir: dir})
	if len(testfs.FilesContaining(t, dir, marker)) == 0 {
		t.Fatal("marker in no file before the purge")
	}
	// A read (a long listing, say) open from before the purge ...
	started, end, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		_ = b.view(func(*badger.Txn) error {
			close(started)
			<-end
			return nil
		})
	}()
	<-started
	// ... ends just after the scrub's commit.
	b.commitTxn = func(commit func() error, writes []write) error {
		err := commit()
		for _, w := range writes {
			if bytes.Equal(w.key, []byte(scrubKey)) {
				close(end)
				<-ended
			}
		}
		return err
	}
	if n, err := b.Purge(ctx, store.PurgeQuery{Keys: []store.Key{gone.Key()}}); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	if got := testfs.FilesContaining(t, dir, marker); len(got) != 0 {
		t.Errorf("after the purge (no read open any more) the marker is still in %v", got)
	}
}

// A store written by Badger in its own mode (earlier versions of the
// plugin) opens in managed mode with everything visible, its writes land
// above the old versions, and its files open in Badger's own mode again.
func TestManagedOpensUnmanagedStore(t *testing.T) {
	dir := t.TempDir()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := db.Update(func(txn *badger.Txn) error {
			return txn.Set(fmt.Appendf(nil, "x/%d", i), []byte("old"))
		}); err != nil {
			t.Fatal(err)
		}
	}
	newest := db.MaxVersion()
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
	if err := m.Update(func(txn *badger.Txn) error { return txn.Set([]byte("x/0"), []byte("new")) }); err != nil {
		t.Fatal(err)
	}
	if err := m.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte("x/0"))
		if err == nil && item.Version() <= newest {
			err = fmt.Errorf("managed write at version %d, not above the store's newest %d", item.Version(), newest)
		}
		return err
	}); err != nil {
		t.Error(err)
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
		item, err := txn.Get([]byte("x/0"))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if string(v) != "new" {
				return fmt.Errorf("x/0 = %q after reopening in Badger's own mode, want the managed write", v)
			}
			return nil
		})
	}); err != nil {
		t.Error(err)
	}
}
