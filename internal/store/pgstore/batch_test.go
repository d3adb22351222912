package pgstore

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestPGBatcherGathersDeferrable: deferrable operations that arrive one by
// one, each taken by a committer before the next is sent, share the
// committers' batches (at most one per committer) instead of running
// alone; an operation someone waits on is not held back by them; closing
// runs what was gathered.
func TestPGBatcherGathersDeferrable(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	b := newPGBatcher(func(ctx context.Context, ops []*pgOp[int]) error {
		mu.Lock()
		sizes = append(sizes, len(ops))
		mu.Unlock()
		return nil
	}, time.Hour)
	lazy := store.Deferrable(context.Background())
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if _, err := b.do(lazy, i); err != nil {
				t.Error(err)
			}
		})
		for b.committer.Taken() < int64(i+1) {
			runtime.Gosched()
		}
	}
	waited := make(chan error, 1)
	go func() {
		_, err := b.do(context.Background(), -1)
		waited <- err
	}()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an operation someone waits on was held back by the deferrable ones")
	}
	b.close()
	wg.Wait()
	total := 0
	for _, s := range sizes {
		total += s
	}
	if total != n+1 || len(sizes) > pgCommitters+1 {
		t.Errorf("batches %v: want %d operations in at most %d batches", sizes, n+1, pgCommitters+1)
	}
}
