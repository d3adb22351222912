package badgerstore_test

import (
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/store/storetest"
)

// TestBadgerConformance runs the Store conformance suite on Badger stores
// on disk, each in its own temporary directory.
func TestBadgerConformance(t *testing.T) {
	type opened struct {
		dir  string
		term time.Duration
	}
	var mu sync.Mutex
	dirs := map[store.Store]opened{}
	open := func(t *testing.T, o opened) store.Store {
		t.Helper()
		b, err := badgerstore.Open(badgerstore.Options{Dir: o.dir, LeaseTerm: o.term, SelfCheck: true})
		if err != nil {
			t.Fatalf("Open(%s): %v", o.dir, err)
		}
		t.Cleanup(func() {
			if err := b.Close(); err != nil {
				t.Errorf("closing the store: %v", err)
			}
		})
		mu.Lock()
		dirs[b] = o
		mu.Unlock()
		return b
	}
	storetest.Run(t, storetest.Harness{
		Open: func(t *testing.T) store.Store { return open(t, opened{dir: t.TempDir()}) },
		Reopen: func(t *testing.T, s store.Store) store.Store {
			mu.Lock()
			o, ok := dirs[s]
			mu.Unlock()
			if !ok {
				t.Fatal("Reopen of a store the harness did not open")
			}
			if err := s.Close(); err != nil {
				t.Fatalf("closing the store to reopen it: %v", err)
			}
			return open(t, o)
		},
		OpenLeaseTerm: func(t *testing.T, term time.Duration) store.Store {
			return open(t, opened{dir: t.TempDir(), term: term})
		},
		RestartReason: "interrupted by restart",
		ExpiredReason: "interrupted: lease expired before the forward reported",
		Check:         badgerstore.CheckIndexes,
	})
}

// TestBadgerListPageWalk runs the ListPage test with every state listed
// by walking the received-time index (as a state with more records than
// ListPage gathers is).
func TestBadgerListPageWalk(t *testing.T) {
	storetest.RunListPage(t, storetest.Harness{
		Open: func(t *testing.T) store.Store {
			b, err := badgerstore.Open(badgerstore.WithGatherMax(badgerstore.Options{Dir: t.TempDir(), SelfCheck: true}, 0))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return b
		},
	})
}
