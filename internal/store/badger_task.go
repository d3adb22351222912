package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Task keys:
//
//	t/<provider>/<id>                               → JSON Task
//	p/<8-byte big-endian NextPollAt unix ns><provider>/<id> → empty; the poll index
const (
	taskPrefix = "t/"
	pollPrefix = "p/"
)

// AddTask implements TaskStore.
func (b *Badger) AddTask(ctx context.Context, t *Task) (*Task, error) {
	key := taskKey(t.Key())
	var existing *Task
	o := &op{size: 1024}
	o.apply = func(txn *badger.Txn) error {
		existing, o.readOnly = nil, false
		old, err := getTask(txn, key)
		if err == nil {
			existing, o.readOnly = old, true
			return nil
		}
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		nt := *t
		switch _, err := getRecord(txn, recordKey(t.Key())); {
		case err == nil:
			nt.State, nt.NextPollAt = TaskDone, time.Time{}
		case !errors.Is(err, ErrNotFound):
			return err
		}
		return writeTask(txn, nil, &nt)
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
		t, err = getTask(txn, taskKey(key))
		return err
	})
	return t, err
}

// UpdateTask implements TaskStore.
func (b *Badger) UpdateTask(ctx context.Context, key Key, fn func(*Task) error) (*Task, error) {
	k := taskKey(key)
	var result *Task
	o := &op{size: 1024, apply: func(txn *badger.Txn) error {
		result = nil
		old, err := getTask(txn, k)
		if err != nil {
			return err
		}
		cur := *old
		if err := fn(&cur); err != nil {
			result = old
			return err
		}
		result = &cur
		return writeTask(txn, old, &cur)
	}}
	err := b.submit(ctx, o)
	return result, err
}

// DueTasks implements TaskStore.
func (b *Badger) DueTasks(ctx context.Context, now time.Time, limit int) ([]*Task, error) {
	var out []*Task
	err := b.view(func(txn *badger.Txn) error {
		return scanIndex(ctx, txn, pollPrefix, now, limit, func(tail []byte) error {
			t, err := getTask(txn, append([]byte(taskPrefix), tail...))
			if errors.Is(err, ErrNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			out = append(out, t)
			return nil
		})
	})
	return out, err
}

// completeTask marks the pending task of rec's key done, in the
// transaction that stores rec, and copies its submission time into rec.
func completeTask(txn *badger.Txn, rec *Record) error {
	k := taskKey(rec.Key())
	old, err := getTask(txn, k)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	rec.SubmittedAt = old.SubmittedAt
	if old.State != TaskPending {
		return nil
	}
	t := *old
	t.State, t.NextPollAt, t.UpdatedAt = TaskDone, time.Time{}, rec.ReceivedAt
	return writeTask(txn, old, &t)
}

func taskKey(k Key) []byte { return []byte(taskPrefix + k.Provider + "/" + k.ID) }

func getTask(txn *badger.Txn, key []byte) (*Task, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	t := new(Task)
	if err := item.Value(func(v []byte) error { return json.Unmarshal(v, t) }); err != nil {
		return nil, fmt.Errorf("decoding task %q: %w", key, err)
	}
	return t, nil
}

// writeTask stores t and moves its poll index entry from old's NextPollAt.
func writeTask(txn *badger.Txn, old, t *Task) error {
	val, err := json.Marshal(t)
	if err != nil {
		return fmt.Errorf("encoding task: %w", err)
	}
	exp := uint64(t.ExpiresAt.Unix())
	k := t.Key()
	if old != nil && !old.NextPollAt.IsZero() && !old.NextPollAt.Equal(t.NextPollAt) {
		if err := txn.Delete(indexKey(pollPrefix, old.NextPollAt, k)); err != nil {
			return err
		}
	}
	if !t.NextPollAt.IsZero() {
		e := badger.NewEntry(indexKey(pollPrefix, t.NextPollAt, k), nil)
		e.ExpiresAt = exp
		if err := txn.SetEntry(e); err != nil {
			return err
		}
	}
	e := badger.NewEntry(taskKey(k), val)
	e.ExpiresAt = exp
	return txn.SetEntry(e)
}
