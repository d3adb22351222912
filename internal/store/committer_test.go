package store

import (
	"errors"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// testOp is an operation of the tests' committers: its size, whether it is
// lazy, and a channel the commit closes.
type testOp struct {
	n    int
	size int
	lazy bool
	done chan struct{}
}

// recorder is a Commit that records each batch's operations (by n) and
// releases them; hold, while set, makes a commit wait until it is closed.
type recorder struct {
	mu      sync.Mutex
	batches [][]int
	hold    chan struct{}
	started chan struct{} // gets a value when a held commit starts
}

func (r *recorder) commit(batch []*testOp) {
	if r.hold != nil {
		r.started <- struct{}{}
		<-r.hold // closed: every later commit passes
	}
	var ns []int
	for _, op := range batch {
		ns = append(ns, op.n)
	}
	r.mu.Lock()
	r.batches = append(r.batches, ns)
	r.mu.Unlock()
	for _, op := range batch {
		close(op.done)
	}
}

func newOp(n, size int, lazy bool) *testOp {
	return &testOp{n: n, size: size, lazy: lazy, done: make(chan struct{})}
}

// TestCommitterBatchesQueued: while a commit runs, the operations that
// arrive queue up, and the next batch takes all of them, up to MaxOps or
// MaxBytes (the operation that reaches MaxBytes is a batch's last).
func TestCommitterBatchesQueued(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxOps   int
		maxBytes int
		sizes    []int // of the operations submitted behind the held one
		want     [][]int
	}{
		{name: "all queued in one batch", maxOps: 8, sizes: []int{1, 1, 1, 1}, want: [][]int{{0}, {1, 2, 3, 4}}},
		{name: "MaxOps", maxOps: 3, sizes: []int{1, 1, 1, 1}, want: [][]int{{0}, {1, 2, 3}, {4}}},
		{name: "MaxBytes", maxOps: 8, maxBytes: 10, sizes: []int{4, 4, 4, 4}, want: [][]int{{0}, {1, 2, 3}, {4}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &recorder{hold: make(chan struct{}), started: make(chan struct{}, 8)}
			c := NewCommitter(CommitterConfig[*testOp]{
				Commit: r.commit, MaxOps: tc.maxOps, MaxBytes: tc.maxBytes,
				Size: func(op *testOp) int { return op.size },
			})
			ops := []*testOp{newOp(0, 1, false)}
			if err := c.Submit(ops[0]); err != nil {
				t.Fatal(err)
			}
			<-r.started // the first batch is being committed, alone
			for i, size := range tc.sizes {
				op := newOp(i+1, size, false)
				ops = append(ops, op)
				if i < tc.maxOps { // room in the queue (MaxOps long)
					if err := c.Submit(op); err != nil {
						t.Fatal(err)
					}
					continue
				}
				go func() { // queued once the next batch makes room
					if err := c.Submit(op); err != nil {
						t.Error(err)
					}
				}()
			}
			close(r.hold)
			for _, op := range ops {
				<-op.done
			}
			c.Close()
			if !slices.EqualFunc(r.batches, tc.want, slices.Equal) {
				t.Errorf("batches %v, want %v", r.batches, tc.want)
			}
		})
	}
}

// TestCommitterLazyWaits: a batch of only lazy operations waits for more
// (up to LazyWait, here an hour), and an operation that is not lazy ends
// the wait at once, sharing the batch.
func TestCommitterLazyWaits(t *testing.T) {
	r := &recorder{}
	c := NewCommitter(CommitterConfig[*testOp]{
		Commit: r.commit, MaxOps: 8, LazyWait: time.Hour,
		Lazy: func(op *testOp) bool { return op.lazy },
	})
	defer c.Close()
	lazy, eager := newOp(0, 0, true), newOp(1, 0, false)
	if err := c.Submit(lazy); err != nil {
		t.Fatal(err)
	}
	for c.Taken() < 1 {
		runtime.Gosched() // until the loop holds the lazy operation
	}
	if err := c.Submit(eager); err != nil {
		t.Fatal(err)
	}
	<-eager.done
	<-lazy.done
	if want := [][]int{{0, 1}}; !slices.EqualFunc(r.batches, want, slices.Equal) {
		t.Errorf("batches %v, want %v (the lazy operation waited for the other)", r.batches, want)
	}
}

// TestCommitterClose: Close commits every operation already queued, then
// refuses new ones with ErrClosed.
func TestCommitterClose(t *testing.T) {
	r := &recorder{hold: make(chan struct{}), started: make(chan struct{}, 8)}
	c := NewCommitter(CommitterConfig[*testOp]{Commit: r.commit, MaxOps: 4})
	ops := []*testOp{newOp(0, 0, false), newOp(1, 0, false), newOp(2, 0, false)}
	for i, op := range ops {
		if err := c.Submit(op); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			<-r.started
		}
	}
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	close(r.hold)
	<-closed
	for _, op := range ops {
		select {
		case <-op.done:
		default:
			t.Errorf("operation %d queued before Close was not committed", op.n)
		}
	}
	if err := c.Submit(newOp(3, 0, false)); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after Close = %v, want ErrClosed", err)
	}
}
