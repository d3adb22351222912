package badgerstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestBadgerOpensOverEmptyMemtableLog reopens a store whose directory
// holds a 0-byte memtable log, as a kill between Badger's create and
// sizing of the file leaves it (seen under TestJournalSIGKILL): the open
// succeeds and the committed record is still there.
func TestBadgerOpensOverEmptyMemtableLog(t *testing.T) {
	dir := t.TempDir()
	b, err := openChecked(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := &store.Record{Provider: "2captcha", ID: "9001", Code: "OK", Source: store.SourceCallback, ReceivedAt: now,
		Delivery: store.Delivery{State: store.StateDelivered, UpdatedAt: now}, ExpiresAt: now.Add(time.Hour)}
	if _, err := b.Insert(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// The next memtable log's number, created and never sized.
	empty := filepath.Join(dir, "00099.mem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err = openChecked(Options{Dir: dir})
	if err != nil {
		t.Fatalf("open over an empty memtable log: %v", err)
	}
	defer b.Close()
	got, err := b.Get(context.Background(), rec.Key())
	if err != nil || got.Code != "OK" {
		t.Fatalf("record after the reopen: %+v, %v", got, err)
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) {
		t.Errorf("the empty memtable log is still there: %v", err)
	}
}
