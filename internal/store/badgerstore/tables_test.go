package badgerstore

import (
	"fmt"
	"os"
	"testing"

	"github.com/dgraph-io/badger/v4/options"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestTableLayouts: a store opened with a measured layout of its tables
// (bench/tables.sh) writes its tables that way, Tables describes them (what
// bench/fill prints), and a compressed layout without a block cache is
// refused with an error, leaving the directory empty, where Badger itself
// would panic.
func TestTableLayouts(t *testing.T) {
	for _, tc := range []struct {
		name       string
		tables     TableOptions
		refused    bool
		compressed bool
	}{
		{name: "the store's own", tables: TableOptions{}},
		{name: "zstd with a block cache", tables: TableOptions{Compression: options.ZSTD, BlockCache: 1 << 20}, compressed: true},
		{name: "snappy without a block cache", tables: TableOptions{Compression: options.Snappy}, refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.refused {
				b, err := Open(Options{Dir: dir, Tables: tc.tables})
				if err == nil {
					_ = b.Close()
					t.Fatal("opened a compressed layout without a block cache")
				}
				if entries, _ := os.ReadDir(dir); len(entries) > 0 {
					t.Errorf("the refused open left %d files in the directory", len(entries))
				}
				return
			}
			b, err := Open(Options{Dir: dir, Tables: tc.tables})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 300 {
				mustInsert(t, b, testRecord(fmt.Sprintf("layout%03d", i), store.StateDelivered))
			}
			// Closing flushes the memtable into a table.
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			b = openTestBadger(t, Options{Dir: dir, Tables: tc.tables})
			info := b.Tables()
			n := 0
			for _, c := range info.Levels {
				n += c
			}
			if n == 0 || info.OnDisk <= 0 {
				t.Fatalf("Tables() = %+v: no table after a close", info)
			}
			if info.Index <= 0 || info.Bloom <= 0 || info.Bloom > info.Index || info.Index > info.OnDisk {
				t.Errorf("Tables() = %+v: want 0 < bloom filters <= indexes <= tables", info)
			}
			compressed := false
			for _, ti := range b.db.Tables() {
				compressed = compressed || ti.OnDiskSize < ti.UncompressedSize
			}
			if compressed != tc.compressed {
				t.Errorf("tables compressed: %v, want %v", compressed, tc.compressed)
			}
			// The records read back through the layout.
			for _, id := range []string{"layout000", "layout299"} {
				if _, err := b.Get(ctx, store.Key{Provider: "captchaai", ID: id}); err != nil {
					t.Errorf("Get(%s): %v", id, err)
				}
			}
		})
	}
}
