package store

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// A store whose memtable log was written with larger memtables than the
// store now opens with (an earlier version's 16 MiB, then a crash before
// the log was flushed) opens with that size and keeps every record;
// replayed into a memtable of today's size, the log would make Badger
// panic at open ("Arena too small").
func TestBadgerOpensLogsOfLargerMemtables(t *testing.T) {
	dir := t.TempDir()
	o := BadgerOptions{Dir: dir}
	o.memTableSize = 2 * badgerMemTableSize
	b := openTestBadger(t, o)
	const n, workers = 1500, 8 // about 12 MiB: more than a memtable of today's size holds
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if _, err := b.Insert(ctx, bigRecord(fmt.Sprint(i), 8<<10)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// The directory as a crash now would leave it: the store is idle and
	// its memtable unflushed (Close would flush it).
	crashed := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var logs int
	for _, e := range entries {
		if e.Name() == "LOCK" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Ext(e.Name()) == ".mem" {
			logs++
			if int64(len(data)) != 4*badgerMemTableSize {
				t.Fatalf("%s holds %d bytes, want twice the memtable size it was opened with (%d)", e.Name(), len(data), 4*badgerMemTableSize)
			}
		}
		if err := os.WriteFile(filepath.Join(crashed, e.Name()), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if logs == 0 {
		t.Fatal("no memtable log in the store: the test proves nothing")
	}
	if got := memTableOfLogs(crashed); got != 2*badgerMemTableSize {
		t.Fatalf("memTableOfLogs = %d, want %d", got, 2*badgerMemTableSize)
	}
	c := openTestBadger(t, BadgerOptions{Dir: crashed})
	if got := c.db.Opts().MemTableSize; got != 2*badgerMemTableSize {
		t.Errorf("opened with MemTableSize %d, want the logs' %d", got, 2*badgerMemTableSize)
	}
	for i := range n {
		if _, err := c.Get(ctx, key(fmt.Sprint(i))); err != nil {
			t.Fatalf("record %d after the reopen: %v", i, err)
		}
	}
	// A new store gets today's size.
	if got := openTestBadger(t, BadgerOptions{Dir: t.TempDir()}).db.Opts().MemTableSize; got != badgerMemTableSize {
		t.Errorf("a new store's MemTableSize %d, want %d", got, badgerMemTableSize)
	}
}
