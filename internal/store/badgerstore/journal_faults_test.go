package badgerstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// An open without the journal (JournalSize < 0) of a store whose journal
// holds records Badger lost replays them first; a later journaled open
// then does not replay them over the newer writes.
func TestJournalReplayedWhenOpenedWithout(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	b.loseCommit = func() bool { return true }
	for i := range 10 {
		mustInsert(t, b, testRecord(fmt.Sprint(i), store.StateForwarding))
	}
	b.crash()

	b = openTestBadger(t, Options{Dir: dir, JournalSize: -1})
	for i := range 10 {
		if _, err := b.UpdateDelivery(ctx, key(fmt.Sprint(i)), delivered); err != nil {
			t.Fatalf("record %d after an open without the journal: %v", i, err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTestBadger(t, journalOpts(dir))
	for i := range 10 {
		if r := mustGet(t, b, key(fmt.Sprint(i))); r.State != store.StateDelivered {
			t.Errorf("record %d is %s after a journaled open, want delivered (an old journal record replayed over it)", i, r.State)
		}
	}
	checkIndexesOK(t, b)
}

// A Badger commit that fails after its journal record was synced may
// leave part of the batch in Badger. The store must not go on (a
// checkpoint would make the part durable): it reports itself unavailable
// and fails every later write, and the next open replays the record
// whole, leaving a consistent state.
func TestJournalCommitRefusedPartWay(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	mustInsert(t, b, testRecord("a", store.StateForwarding))
	var once atomic.Bool
	b.commitTxn = func(commit func() error, writes []write) error {
		if !once.CompareAndSwap(false, true) {
			return commit()
		}
		// Half of the batch reaches Badger, then the commit fails.
		if err := b.db.Update(func(txn *badger.Txn) error {
			return (&batch{txn: txn, writes: writes[:len(writes)/2]}).flush()
		}); err != nil {
			t.Fatal(err)
		}
		return errors.New("injected: value log write failed")
	}
	if _, err := b.Insert(ctx, testRecord("b", store.StateForwarding)); err == nil {
		t.Fatal("insert acknowledged although its commit failed")
	}
	if b.Available() {
		t.Error("Available() after a commit failed part-way")
	}
	if _, err := b.Insert(ctx, testRecord("c", store.StateForwarding)); err == nil {
		t.Error("an insert after a commit failed part-way was acknowledged: the part would be checkpointed as if consistent")
	}
	_ = b.Close()

	b = openTestBadger(t, journalOpts(dir))
	mustGet(t, b, key("a"))
	if r, err := b.Get(ctx, key("b")); err != nil || r.Code != "CODE-b" {
		t.Errorf("b after the reopen: %v, %v; want the replayed record", r, err)
	}
	checkIndexesOK(t, b)
	mustInsert(t, b, testRecord("c", store.StateForwarding))
}

// Every record the store accepts stays out of Badger's value log, whose
// garbage collection rewrites entries unsynced: a record of MaxRecordSize
// bytes is stored in the LSM tree, one byte more is refused.
func TestBadgerRecordsStayOutOfValueLog(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	sized := func(id string, n int) *store.Record {
		r := testRecord(id, store.StateQueued)
		body := 1<<20 - 4096
		for range 3 {
			r.Request.Body = make([]byte, body)
			enc, err := encodeRecord(r)
			if err != nil {
				t.Fatal(err)
			}
			body += n - len(enc)
		}
		r.Request.Body = make([]byte, body)
		if enc, _ := encodeRecord(r); len(enc) != n {
			t.Fatalf("record of %d bytes encoded, want %d", len(enc), n)
		}
		return r
	}
	if _, err := b.Insert(ctx, sized("over", store.MaxRecordSize+1)); !errors.Is(err, store.ErrTooLarge) {
		t.Errorf("record of MaxRecordSize+1 bytes: %v, want ErrTooLarge", err)
	}
	mustInsert(t, b, sized("max", 1<<20-1))
	mustInsert(t, b, sized("max2", store.MaxRecordSize))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".vlog") {
			continue
		}
		st, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 1<<10 {
			t.Errorf("%s holds %d bytes: a record went to the value log", e.Name(), st.Size())
		}
	}
}
