package badgerstore

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"

	"github.com/caddy-pingback/pingback/internal/testfs"
)

// TestBadgerPurgeErasesBytes: a unique marker in a pingback body is in the
// store's files (journal, memtable log or tables) before the purge and in
// none of them when Purge returns, wherever the record was: only in the
// journal and the memtable, in a table after a reopen (Close flushes the
// memtables), or in a lower level after a flatten; by key or by filter.
// Records around it keep their bytes.
func TestBadgerPurgeErasesBytes(t *testing.T) {
	for _, tc := range []struct {
		name         string
		reopen, flat bool
		q            func(k store.Key) store.PurgeQuery
	}{
		{"memtable, by key", false, false, func(k store.Key) store.PurgeQuery { return store.PurgeQuery{Keys: []store.Key{k}} }},
		{"tables, by key", true, false, func(k store.Key) store.PurgeQuery { return store.PurgeQuery{Keys: []store.Key{k}} }},
		{"lower level, by filter", true, true, func(store.Key) store.PurgeQuery { return store.PurgeQuery{State: store.StateParked} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			b, err := openChecked(Options{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = b.Close() }()
			rnd := make([]byte, 12)
			_, _ = rand.Read(rnd)
			marker := []byte("ERASE-ME-" + hex.EncodeToString(rnd))
			keep := []byte("KEEP-ME-" + hex.EncodeToString(rnd))
			var others []*store.Record
			for i := range 300 {
				r := testRecord("n"+strings.Repeat("0", 3)+string(rune('a'+i%26))+hex.EncodeToString([]byte{byte(i), byte(i >> 8)}), store.StateDelivered)
				r.Request.Body = append([]byte("id=1&code="), keep...)
				others = append(others, r)
			}
			mustInsert(t, b, others...)
			gone := testRecord("42", store.StateParked)
			gone.Request.Body = append([]byte("id=42&code="), marker...)
			mustInsert(t, b, gone)
			if tc.reopen {
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
				if b, err = openChecked(Options{Dir: dir}); err != nil {
					t.Fatal(err)
				}
			}
			if tc.flat {
				if err := b.db.Flatten(1); err != nil {
					t.Fatal(err)
				}
				mustInsert(t, b, testRecord("after", store.StateDelivered))
			}
			if got := testfs.FilesContaining(t, dir, marker); len(got) == 0 {
				t.Fatal("the marker is in no file before the purge: the test cannot tell")
			}
			n, err := b.Purge(ctx, tc.q(gone.Key()))
			if err != nil || n != 1 {
				t.Fatalf("Purge = %d, %v; want 1", n, err)
			}
			if got := testfs.FilesContaining(t, dir, marker); len(got) != 0 {
				t.Errorf("after Purge the marker is still in %v", got)
			}
			if got := testfs.FilesContaining(t, dir, keep); len(got) == 0 {
				t.Error("the other records' bytes are gone too")
			}
			if err := b.view(func(txn *badger.Txn) error { return checkIndexes(txn) }); err != nil {
				t.Error(err)
			}
			for _, r := range others[:3] {
				mustGet(t, b, r.Key())
			}
			// Writes go on after the scrub, and survive a reopen (the
			// journal starts again at the start of its first file).
			mustInsert(t, b, testRecord("later", store.StateFailed))
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			if b, err = openChecked(Options{Dir: dir}); err != nil {
				t.Fatal(err)
			}
			mustGet(t, b, key("later"))
			if _, err := b.Get(ctx, gone.Key()); err != store.ErrPurged {
				t.Errorf("Get of the purged record after a reopen: %v, want ErrPurged", err)
			}
		})
	}
}

// TestBadgerPurgeCrashAfterScrub: records committed after a scrub are
// replayed from the journal's first file after a crash.
func TestBadgerPurgeCrashAfterScrub(t *testing.T) {
	dir := t.TempDir()
	b, err := openChecked(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	mustInsert(t, b, testRecord("a", store.StateParked))
	if n, err := b.Purge(ctx, store.PurgeQuery{Keys: []store.Key{key("a")}}); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	b.loseCommit = func() bool { return true } // Badger loses what follows; the journal has it
	mustInsert(t, b, testRecord("b", store.StateFailed))
	b.crash()
	b = openTestBadger(t, Options{Dir: dir})
	mustGet(t, b, key("b"))
	if _, err := b.Get(ctx, key("a")); err != store.ErrPurged {
		t.Errorf("Get(a): %v, want ErrPurged", err)
	}
}

// TestBadgerFormat3BuildsReceivedIndex: a store of format 3 (no i/
// entries) gets them at open, and lists in received-time order.
func TestBadgerFormat3BuildsReceivedIndex(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	r1, r2 := testRecord("1", store.StateDelivered), testRecord("2", store.StateParked)
	r1.ReceivedAt = r2.ReceivedAt.Add(1)
	mustInsert(t, b, r1, r2)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	downgrade(t, dir, receivedPrefix, "3")
	b = openTestBadger(t, Options{Dir: dir})
	if err := CheckIndexes(b); err != nil {
		t.Fatal(err)
	}
	p, err := b.ListPage(ctx, store.ListQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Records) != 2 || p.Records[0].ID != "2" || p.Records[1].ID != "1" {
		t.Errorf("ListPage after the upgrade: %v", p.Records)
	}
}
