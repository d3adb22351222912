package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Task keys:
//
//	t/<provider>/<id>                               → JSON Task
//	p/<8-byte big-endian NextPollAt unix ns><provider>/<id> → empty; the poll index
//	o/<state>/<provider>/<8-byte SubmittedAt unix ns><id>   → empty; the task order (badger_taskorder.go)
const (
	taskPrefix = "t/"
	pollPrefix = "p/"
)

// AddTask implements TaskStore.
func (b *Badger) AddTask(ctx context.Context, t *Task) (*Task, error) {
	k := t.Key()
	var existing *Task
	o := &op{size: 1024}
	o.apply = func(w *batch) error {
		existing = nil
		old, err := w.task(k)
		if err == nil {
			existing = old
			return nil
		}
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		nt := *t
		switch rec, err := w.record(k); {
		case err == nil && completes(rec, nt.SubmittedAt):
			nt.State, nt.NextPollAt, nt.ResultAt = TaskDone, time.Time{}, rec.ReceivedAt
		case err != nil && !errors.Is(err, ErrNotFound):
			return err
		}
		return w.writeTask(nil, &nt)
	}
	if err := b.submit(ctx, o); err != nil {
		return nil, err
	}
	return existing, nil
}

// GetTask implements TaskStore.
func (b *Badger) GetTask(ctx context.Context, key Key) (*Task, error) {
	var t *Task
	err := b.view(func(txn *badger.Txn) error {
		var err error
		t, err = (&batch{txn: txn}).task(key)
		return err
	})
	return t, err
}

// UpdateTask implements TaskStore.
func (b *Badger) UpdateTask(ctx context.Context, key Key, fn func(*Task) error) (*Task, error) {
	var result *Task
	o := &op{size: 1024, apply: func(w *batch) error {
		result = nil
		old, err := w.task(key)
		if err != nil {
			return err
		}
		result = old
		cur := *old
		if err := fn(&cur); err != nil {
			return err
		}
		result = &cur
		return w.writeTask(old, &cur)
	}}
	err := b.submit(ctx, o)
	return result, err
}

// DueTasks implements TaskStore.
func (b *Badger) DueTasks(ctx context.Context, now time.Time, limit int) ([]*Task, error) {
	var out []*Task
	err := b.view(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		var keys []Key
		err := w.scan(pollPrefix, func(k []byte) bool {
			at, key, ok := parseTimeKey(pollPrefix, k)
			if !ok {
				return true
			}
			if at.After(now) || ctx.Err() != nil {
				return false
			}
			keys = append(keys, key)
			return len(keys) < limit
		})
		if err != nil {
			return err
		}
		for _, k := range keys {
			t, err := w.task(k)
			if errors.Is(err, ErrNotFound) {
				continue
			}
			if err != nil {
				return err
			}
			if t.State != TaskPending {
				continue // a poll entry written before writeTask kept only pending ones
			}
			out = append(out, t)
		}
		return ctx.Err()
	})
	return out, err
}

// completes reports whether rec, a stored result, completes a task
// submitted at submitted: not a quarantined one, and not one received
// before its task was submitted (a result cannot be older than its task).
func completes(rec *Record, submitted time.Time) bool {
	return rec.State != StateQuarantined && !rec.ReceivedAt.Before(submitted)
}

// completeTask marks the pending task under k done at now (the result's
// received time), in the batch that stores its result, and returns the
// task's submission time (zero if the task is not tracked, or was
// submitted after now: a result received before its task was submitted
// never completes it).
func completeTask(w *batch, k Key, now time.Time) (time.Time, error) {
	old, err := w.task(k)
	if errors.Is(err, ErrNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	if now.Before(old.SubmittedAt) {
		return time.Time{}, nil
	}
	if old.State != TaskPending {
		return old.SubmittedAt, nil
	}
	t := *old
	t.State, t.NextPollAt, t.UpdatedAt, t.ResultAt = TaskDone, time.Time{}, now, now
	return old.SubmittedAt, w.writeTask(old, &t)
}

func taskKey(k Key) []byte { return []byte(taskPrefix + k.Provider + "/" + k.ID) }

// task returns the task under k, or ErrNotFound.
func (w *batch) task(k Key) (*Task, error) {
	if !w.mayHoldTask(k.Provider) {
		if SelfCheck {
			w.checkAbsent(taskKey(k))
		}
		return nil, ErrNotFound
	}
	item, err := w.get(taskKey(k))
	if err != nil {
		return nil, err
	}
	t := new(Task)
	if err := item.Value(func(v []byte) error { return decodeTask(v, t) }); err != nil {
		return nil, fmt.Errorf("decoding task %s: %w", k, err)
	}
	return t, nil
}

// writeTask stores t, moves its poll index entry from old's NextPollAt
// and its task order entry (badger_taskorder.go) from old's.
func (w *batch) writeTask(old, t *Task) error {
	val, err := encodeTask(t)
	if err != nil {
		return fmt.Errorf("encoding task: %w", err)
	}
	exp := expiry(t.ExpiresAt)
	k := t.Key()
	if was, is := old != nil && old.State == TaskPending, t.State == TaskPending; was != is {
		n := int64(1)
		if was {
			n = -1
		}
		w.counted = append(w.counted, countDelta{provider: k.Provider, task: true, n: n})
	}
	was, is := old != nil && old.State == TaskPending, t.State == TaskPending
	if was && (!is || !old.SubmittedAt.Equal(t.SubmittedAt)) {
		w.trackPending(old, -1)
	}
	if is && (!was || !old.SubmittedAt.Equal(t.SubmittedAt)) {
		w.trackPending(t, 1)
	}
	// Only a pending task is polled, whatever poll time it was left with.
	polled := t.State == TaskPending && !t.NextPollAt.IsZero()
	if old != nil && !old.NextPollAt.IsZero() && (!polled || !old.NextPollAt.Equal(t.NextPollAt)) {
		w.del(timeKey(pollPrefix, old.NextPollAt, k))
	}
	if polled {
		w.set(timeKey(pollPrefix, t.NextPollAt, k), nil, exp)
	}
	w.writeTaskOrder(old, t, exp)
	w.set(taskKey(k), val, exp)
	return nil
}
