package store

import (
	"context"
	"sync"
	"testing"
	"time"
)

// recordingBatcher is an update batcher whose batches only record the
// keys they ran.
func recordingBatcher(t *testing.T) (*pgBatcher[*pgUpdate], func() []string) {
	var mu sync.Mutex
	var ran []string
	b := newPGBatcher(func(ctx context.Context, ops []*pgOp[*pgUpdate]) error {
		mu.Lock()
		defer mu.Unlock()
		for _, op := range ops {
			ran = append(ran, op.in.key.ID)
		}
		return nil
	})
	t.Cleanup(b.close)
	return b, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), ran...)
	}
}

func foldOp(id string) *pgOp[*pgUpdate] {
	return newPGOp(context.Background(), &pgUpdate{key: Key{Provider: "2captcha", ID: id}})
}

// waitDone fails t unless op's done closes within 10 s.
func waitDone(t *testing.T, op *pgOp[*pgUpdate]) {
	t.Helper()
	select {
	case <-op.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("outcome %s never ended", op.in.key.ID)
	}
}

// TestPGFold: the rules by which a deferrable update leaves the fold.
// Each case ends with every outcome run exactly once, by the update
// batcher (ran) or by an insert batch (taken).
func TestPGFold(t *testing.T) {
	cases := []struct {
		name  string
		wait  time.Duration
		add   int
		act   func(f *pgFold) []*pgOp[*pgUpdate] // returns what an insert batch took
		ran   int                                // run by the update batcher
		taken int
	}{
		{"no insert comes: handed over after the wait", 5 * time.Millisecond, 3, nil, 3, 0},
		{"an insert batch takes the oldest, the timer the rest", time.Hour, 3, func(f *pgFold) []*pgOp[*pgUpdate] {
			got := f.take(2)
			f.flush() // the timer firing
			return got
		}, 1, 2},
		{"an insert batch takes all: the timer finds none", time.Hour, 3, func(f *pgFold) []*pgOp[*pgUpdate] {
			got := f.take(pgBatchMax)
			f.flush()
			return got
		}, 0, 3},
		{"pgBatchMax waiting are handed over at once", time.Hour, pgBatchMax, nil, pgBatchMax, 0},
		{"closing hands over what waits", time.Hour, 3, func(f *pgFold) []*pgOp[*pgUpdate] {
			f.close()
			return nil
		}, 3, 0},
		{"after closing, outcomes go straight on", time.Hour, 0, func(f *pgFold) []*pgOp[*pgUpdate] {
			f.close()
			for _, id := range []string{"late1", "late2"} {
				op := foldOp(id)
				f.add(op)
				waitDone(t, op)
			}
			return nil
		}, 2, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			to, ran := recordingBatcher(t)
			f := newPGFold(to, tc.wait)
			var ops []*pgOp[*pgUpdate]
			for i := range tc.add {
				op := foldOp(string(rune('a' + i%26)))
				ops = append(ops, op)
				f.add(op)
			}
			var taken []*pgOp[*pgUpdate]
			if tc.act != nil {
				taken = tc.act(f)
			}
			f.finish(taken, nil)
			for _, op := range ops {
				waitDone(t, op)
			}
			if got := len(ran()); got != tc.ran {
				t.Errorf("update batcher ran %d outcomes, want %d", got, tc.ran)
			}
			if len(taken) != tc.taken || f.carried.Load() != int64(tc.taken) {
				t.Errorf("insert batch took %d, carried %d; want %d", len(taken), f.carried.Load(), tc.taken)
			}
			for i, op := range taken {
				if op != ops[i] {
					t.Errorf("insert batch took outcome %s at %d: want the oldest first", op.in.key.ID, i)
				}
			}
		})
	}
}

// TestPGFoldHoldsUntilTheWaitEnds: outcomes that arrive one by one stay
// in the fold, none sent on, until the wait ends (an insert batch may
// still carry them); then every one of them is handed over at once.
func TestPGFoldHoldsUntilTheWaitEnds(t *testing.T) {
	to, ran := recordingBatcher(t)
	f := newPGFold(to, time.Hour)
	const n = 40
	var ops []*pgOp[*pgUpdate]
	for i := range n {
		op := foldOp(string(rune('a' + i%26)))
		ops = append(ops, op)
		f.add(op)
		if got := to.taken.Load(); got != 0 {
			t.Fatalf("%d outcomes left the fold before the wait ended", got)
		}
	}
	f.flush() // the timer firing
	for _, op := range ops {
		waitDone(t, op)
	}
	if got := len(ran()); got != n {
		t.Errorf("update batcher ran %d outcomes, want %d", got, n)
	}
}
