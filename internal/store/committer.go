package store

import (
	"sync"
	"sync/atomic"
	"time"
)

// Committer is the group commit both drivers run: operations submitted
// from any number of goroutines are queued, and each of the committer's
// loops takes one, every other one already queued (up to MaxOps, and
// MaxBytes by Size), and hands them to Commit as one batch, so that one
// transaction (and one sync) carries every operation that was waiting.
// A batch of only lazy operations (no caller waits for it to answer
// anyone; see Deferrable) first waits up to LazyWait for more, and an
// operation that is not lazy ends that wait at once.
//
// The Committer only gathers: Commit runs the batch and tells each
// operation's caller its result (an operation carries its own way to do
// so, such as a channel Commit closes). It holds no state beyond its
// queue; each store owns its Committers.
type Committer[T any] struct {
	cfg   CommitterConfig[T]
	ch    chan T
	wg    sync.WaitGroup
	mu    sync.RWMutex // held for reading while sending; Close takes it to close ch
	shut  bool
	taken atomic.Int64 // operations taken from the queue
}

// CommitterConfig configures NewCommitter.
type CommitterConfig[T any] struct {
	// Commit runs one batch (one or more operations, in the order they
	// were taken). Each loop calls it in turn; with Loops above 1 batches
	// run concurrently. Required.
	Commit func(batch []T)
	// Loops is how many batches may run at once, each in a goroutine of
	// its own. Default 1.
	Loops int
	// MaxOps caps the operations of a batch; it is also the queue's
	// length. Default 1.
	MaxOps int
	// MaxBytes, if positive, ends the gathering of a batch once the
	// operations' Size add up to it (the operation that reaches it is
	// the batch's last). 0: no limit.
	MaxBytes int
	// Size is an operation's size, in bytes, for MaxBytes.
	Size func(T) int
	// Lazy reports whether an operation is lazy: nil means none is.
	Lazy func(T) bool
	// LazyWait is how long a batch of only lazy operations waits for
	// more before Commit runs.
	LazyWait time.Duration
}

// NewCommitter starts cfg.Loops loops committing what Submit queues.
func NewCommitter[T any](cfg CommitterConfig[T]) *Committer[T] {
	cfg.Loops = max(cfg.Loops, 1)
	cfg.MaxOps = max(cfg.MaxOps, 1)
	c := &Committer[T]{cfg: cfg, ch: make(chan T, cfg.MaxOps)}
	for range cfg.Loops {
		c.wg.Go(c.loop)
	}
	return c
}

// Submit queues op for a batch, waiting while the queue is full. It does
// not wait for the commit: Commit tells op's caller. ErrClosed once Close
// was called (op was not queued).
func (c *Committer[T]) Submit(op T) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.shut {
		return ErrClosed
	}
	c.ch <- op
	return nil
}

// Close refuses further operations, lets the loops commit every operation
// already queued and waits for them to stop.
func (c *Committer[T]) Close() {
	c.mu.Lock()
	if !c.shut {
		c.shut = true
		close(c.ch)
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// Taken is how many operations the loops have taken from the queue.
func (c *Committer[T]) Taken() int64 { return c.taken.Load() }

// Queued is how many operations wait in the queue, not yet taken.
func (c *Committer[T]) Queued() int { return len(c.ch) }

// loop commits batches until Close: see Committer.
func (c *Committer[T]) loop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	batch := make([]T, 0, c.cfg.MaxOps)
	for first := range c.ch {
		batch = c.gather(append(batch[:0], first), timer)
		c.cfg.Commit(batch)
		clear(batch) // let the operations go while the loop waits
	}
}

// gather adds to batch (which holds the first operation) every operation
// already queued and, when all of them are lazy, what arrives within
// LazyWait until one is not.
func (c *Committer[T]) gather(batch []T, timer *time.Timer) []T {
	c.taken.Add(1)
	size := c.size(batch[0])
	lazy := c.lazy(batch[0])
	full := func() bool {
		return len(batch) >= c.cfg.MaxOps || c.cfg.MaxBytes > 0 && size >= c.cfg.MaxBytes
	}
	take := func(op T) {
		c.taken.Add(1)
		batch = append(batch, op)
		size += c.size(op)
	}
	queued := func() {
		for !full() {
			select {
			case op, ok := <-c.ch:
				if !ok {
					return
				}
				take(op)
				lazy = lazy && c.lazy(op)
			default:
				return
			}
		}
	}
	queued()
	if !lazy {
		return batch
	}
	timer.Reset(c.cfg.LazyWait)
	defer timer.Stop()
	for !full() {
		select {
		case op, ok := <-c.ch:
			if !ok {
				return batch
			}
			take(op)
			if !c.lazy(op) {
				queued()
				return batch
			}
		case <-timer.C:
			return batch
		}
	}
	return batch
}

func (c *Committer[T]) size(op T) int {
	if c.cfg.Size == nil {
		return 0
	}
	return c.cfg.Size(op)
}

func (c *Committer[T]) lazy(op T) bool { return c.cfg.Lazy != nil && c.cfg.Lazy(op) }
