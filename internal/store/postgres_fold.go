package store

import (
	"sync"
	"sync/atomic"
	"time"
)

// Outcomes folded into inserts on PostgreSQL. A live forward's outcome is
// a deferrable delivery update (Deferrable): nobody waits on it to answer
// anyone, so it need not have a transaction of its own. It waits here for
// the next insert batch, which locks its row, applies it and writes it in
// the insert's own transaction (insertAttempt): under load a pingback then
// costs one transaction (its insert's, shared with the outcomes of earlier
// pingbacks) instead of two.
//
// An outcome goes to the update batcher instead, to run in a transaction
// of its own as any other delivery update does:
//   - when no insert batch took it within pgLazyWait (no pingbacks are
//     arriving), together with every other outcome waiting then;
//   - when the insert batch found its row locked (the batch never waits
//     for a row lock: a pingback's answer must not wait on an admin action
//     or another instance's claim) or gone (the update batcher then says
//     ErrNotFound);
//   - when the insert's transaction failed with nothing of it committed
//     (the inserts are then run once more without the outcomes, so an
//     outcome's fault never costs a pingback its answer);
//   - when the store is closing: Close hands every waiting outcome over
//     before it closes the update batcher, so none is dropped.
//
// The semantics are UpdateDelivery's: the row is locked while fn runs, fn
// sees the row as committed (and the batch's earlier updates of it), and
// fn may run again after an attempt that did not commit. A commit whose
// outcome is unknown (the connection lost after COMMIT was sent, and the
// database cannot say) fails the outcomes with the error, as it fails an
// update batch.
type pgFold struct {
	to   *pgBatcher[*pgUpdate] // where outcomes go that no insert takes
	wait time.Duration         // how long an outcome waits for an insert

	mu    sync.Mutex
	ops   []*pgOp[*pgUpdate]
	timer *time.Timer // hands the waiting outcomes over after wait
	shut  bool        // closed: outcomes go to the update batcher at once

	carried atomic.Int64 // outcomes committed in an insert's transaction, for tests and benchmarks
}

// newPGFold returns a fold whose outcomes go to the update batcher to
// after wait if no insert batch took them.
func newPGFold(to *pgBatcher[*pgUpdate], wait time.Duration) *pgFold {
	f := &pgFold{to: to, wait: wait}
	f.timer = time.AfterFunc(time.Hour, f.flush)
	f.timer.Stop()
	return f
}

// add queues op (its done not yet closed) for the next insert batch; it is
// handed to the update batcher after f.wait, at once when pgBatchMax are
// waiting, and at once once the fold is closed.
func (f *pgFold) add(op *pgOp[*pgUpdate]) {
	f.mu.Lock()
	if f.shut {
		f.mu.Unlock()
		f.to.send(op)
		return
	}
	f.ops = append(f.ops, op)
	var full []*pgOp[*pgUpdate]
	switch len(f.ops) {
	case 1:
		f.timer.Reset(f.wait)
	case pgBatchMax:
		full = f.takeLocked(pgBatchMax)
	}
	f.mu.Unlock()
	f.hand(full)
}

// take returns up to n waiting outcomes for an insert batch to carry.
func (f *pgFold) take(n int) []*pgOp[*pgUpdate] {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.takeLocked(n)
}

// takeLocked takes up to n outcomes, oldest first; f.mu is held.
func (f *pgFold) takeLocked(n int) []*pgOp[*pgUpdate] {
	n = min(n, len(f.ops))
	if n == 0 {
		return nil
	}
	ops := f.ops[:n:n]
	f.ops = append([]*pgOp[*pgUpdate](nil), f.ops[n:]...)
	if len(f.ops) == 0 {
		f.timer.Stop() // a flush already started takes nothing, or a later outcome early: both harmless
	}
	return ops
}

// flush hands every waiting outcome to the update batcher (the timer's).
func (f *pgFold) flush() {
	f.mu.Lock()
	ops := f.takeLocked(len(f.ops))
	f.mu.Unlock()
	f.hand(ops)
}

// hand gives ops to the update batcher, to run at once in a transaction
// of their own; their results are reset first.
func (f *pgFold) hand(ops []*pgOp[*pgUpdate]) {
	for _, op := range ops {
		op.err, op.in.result = nil, Delivery{}
		f.to.send(op)
	}
}

// finish ends ops that an insert batch carried, with the results the batch
// set (err nil: the transaction committed) or err for each.
func (f *pgFold) finish(ops []*pgOp[*pgUpdate], err error) {
	for _, op := range ops {
		if err != nil {
			op.err = err
		}
		close(op.done)
	}
	if err == nil {
		f.carried.Add(int64(len(ops)))
	}
}

// close hands every waiting outcome to the update batcher; later ones go
// there directly. Call it after the insert batcher is closed (no insert
// batch takes outcomes any more) and before the update batcher is.
func (f *pgFold) close() {
	f.mu.Lock()
	f.shut = true
	ops := f.takeLocked(len(f.ops))
	f.mu.Unlock()
	f.hand(ops)
}
