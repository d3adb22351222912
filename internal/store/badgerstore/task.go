package badgerstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// Task keys (format 7):
//
//	t/<provider>/<id>                                        → Task ([encodeTask])
//	p/<provider>/<account>/<8-byte NextPollAt unix ns><id>   → empty; the poll index
//	o/<state>/<provider>/<account>/<8-byte SubmittedAt unix ns><id> → empty; the task order ([taskOrderPrefix])
//
// The poll index holds one entry per pending task with a poll time, in
// one run per account (provider, account id; "" for a task without
// account), so that DueTasks merges the runs of the accounts it is asked
// for and never steps over another account's due tasks. Stores of format
// 6 and earlier keyed it p/<NextPollAt><provider>/<id>; the format 7
// upgrade rewrote it (upgradeTaskIndexes).
const (
	taskPrefix = "t/"
	pollPrefix = "p/"
)

// pollRunPrefix is the prefix of a's run of the poll index.
func pollRunPrefix(a store.Account) []byte {
	b := make([]byte, 0, len(pollPrefix)+len(a.Provider)+len(a.ID)+2)
	b = append(b, pollPrefix...)
	b = append(b, a.Provider...)
	b = append(b, '/')
	b = append(b, a.ID...)
	return append(b, '/')
}

// pollKey is the p/ entry of t, or nil if t is not polled: only a
// pending task with a poll time is, whatever poll time another state was
// left with.
func pollKey(t *store.Task) []byte {
	if t.State != store.TaskPending || t.NextPollAt.IsZero() {
		return nil
	}
	b := pollRunPrefix(t.TaskAccount())
	b = binary.BigEndian.AppendUint64(b, store.UnixNano(t.NextPollAt))
	return append(b, t.ID...)
}

// duePos is a place in the poll index: the poll time, then the key.
type duePos struct {
	at      time.Time
	account string
	key     store.Key
}

func compareDuePos(a, b duePos) int {
	return cmp.Or(cmp.Compare(store.UnixNano(a.at), store.UnixNano(b.at)),
		strings.Compare(a.key.Provider, b.key.Provider), strings.Compare(a.key.ID, b.key.ID))
}

// parsePollKey splits a p/ key.
func parsePollKey(k []byte) (duePos, bool) {
	provider, account, at, id, ok := splitAccountTimeKey(k[len(pollPrefix):])
	return duePos{at: at, account: account, key: store.Key{Provider: provider, ID: id}}, ok
}

// splitAccountTimeKey splits "<provider>/<account>/<8-byte unix ns><id>",
// the tail of the p/ and o/ keys.
func splitAccountTimeKey(rest []byte) (provider, account string, at time.Time, id string, ok bool) {
	i := bytes.IndexByte(rest, '/')
	if i < 0 {
		return "", "", time.Time{}, "", false
	}
	provider, rest = string(rest[:i]), rest[i+1:]
	j := bytes.IndexByte(rest, '/')
	if j < 0 || len(rest) < j+1+8 {
		return "", "", time.Time{}, "", false
	}
	account = string(rest[:j])
	at = time.Unix(0, int64(binary.BigEndian.Uint64(rest[j+1:]))).UTC()
	return provider, account, at, string(rest[j+1+8:]), true
}

// AddTask implements TaskStore.
func (b *Badger) AddTask(ctx context.Context, t *store.Task) (*store.Task, error) {
	if err := store.CheckAccount(t); err != nil {
		return nil, err
	}
	k := t.Key()
	var existing *store.Task
	o := &op{size: 1024}
	o.apply = func(w *batch) error {
		existing = nil
		old, err := w.task(k)
		if err == nil {
			existing = old
			return nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		nt := *t
		switch rec, err := w.record(k); {
		case err == nil && completes(rec, nt.SubmittedAt):
			nt.State, nt.NextPollAt, nt.ResultAt = store.TaskDone, time.Time{}, rec.ReceivedAt
		case err != nil && !errors.Is(err, store.ErrNotFound):
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
func (b *Badger) GetTask(ctx context.Context, key store.Key) (*store.Task, error) {
	var t *store.Task
	err := b.view(func(txn *badger.Txn) error {
		var err error
		t, err = (&batch{txn: txn}).task(key)
		return err
	})
	return t, err
}

// UpdateTask implements TaskStore.
func (b *Badger) UpdateTask(ctx context.Context, key store.Key, fn func(*store.Task) error) (*store.Task, error) {
	var result *store.Task
	o := &op{size: 1024, apply: func(w *batch) error {
		old, cur, err := store.ApplyUpdate(func() (*store.Task, error) { return w.task(key) }, fn, store.CheckAccount)
		result = old // what a failed update answers
		if err != nil {
			return err
		}
		result = cur
		return w.writeTask(old, cur)
	}}
	err := b.submit(ctx, o)
	return result, err
}

// DueTasks implements TaskStore: a merge of the poll index runs of
// q.Accounts, each from its start, that stops at the first entry after
// q.Now (or once q.Limit tasks are found): it reads the entries it
// returns, the stale ones among them and one more per account, never
// another account's.
func (b *Badger) DueTasks(ctx context.Context, q store.DueQuery) ([]*store.Task, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	accounts := q.UniqueAccounts()
	var out []*store.Task
	err := b.view(func(txn *badger.Txn) error {
		out = nil
		w := &batch{txn: txn}
		starts := make([]runStart, len(accounts))
		for i, a := range accounts {
			p := pollRunPrefix(a)
			starts[i] = runStart{prefix: p, seek: p}
		}
		parse := func(k []byte) (duePos, bool) { return parsePollKey(k) }
		return mergeRuns(ctx, txn, starts, parse, compareDuePos, func(pos duePos) (bool, error) {
			if pos.at.After(q.Now) {
				return false, nil // every run's next entry is later still
			}
			t, err := w.task(pos.key)
			if errors.Is(err, store.ErrNotFound) {
				return true, nil
			}
			if err != nil {
				return false, err
			}
			if t.State != store.TaskPending || t.Account != pos.account {
				return true, nil // a stale entry
			}
			out = append(out, t)
			return len(out) < q.Limit, nil
		})
	})
	return out, err
}

// completes reports whether rec, a stored result, completes a task
// submitted at submitted: not a quarantined one, and not one received
// before its task was submitted (a result cannot be older than its task).
func completes(rec *store.Record, submitted time.Time) bool {
	return rec.State != store.StateQuarantined && !rec.ReceivedAt.Before(submitted)
}

// completeTask marks the pending task under k done at now (the result's
// received time), in the batch that stores its result, and returns the
// task's submission time (zero if the task is not tracked, or was
// submitted after now: a result received before its task was submitted
// never completes it).
func completeTask(w *batch, k store.Key, now time.Time) (time.Time, error) {
	old, err := w.task(k)
	if errors.Is(err, store.ErrNotFound) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	if now.Before(old.SubmittedAt) {
		return time.Time{}, nil
	}
	if old.State != store.TaskPending {
		return old.SubmittedAt, nil
	}
	t := *old
	t.State, t.NextPollAt, t.UpdatedAt, t.ResultAt = store.TaskDone, time.Time{}, now, now
	return old.SubmittedAt, w.writeTask(old, &t)
}

func taskKey(k store.Key) []byte { return []byte(taskPrefix + k.Provider + "/" + k.ID) }

// task returns the task under k, or ErrNotFound.
func (w *batch) task(k store.Key) (*store.Task, error) {
	if !w.mayHoldTask(k.Provider) {
		if w.selfCheck {
			w.checkAbsent(taskKey(k))
		}
		return nil, store.ErrNotFound
	}
	item, err := w.get(taskKey(k))
	if err != nil {
		return nil, err
	}
	t := new(store.Task)
	if err := item.Value(func(v []byte) error { return decodeTask(v, t) }); err != nil {
		return nil, fmt.Errorf("decoding task %s: %w", k, err)
	}
	return t, nil
}

// writeTask stores t, moves its poll index entry from old's (poll time
// or account) and its task order entry ([batch.writeTaskOrder]) from old's,
// and counts it out of old's pending count and into t's.
func (w *batch) writeTask(old, t *store.Task) error {
	val, err := encodeTask(t)
	if err != nil {
		return fmt.Errorf("encoding task: %w", err)
	}
	exp := expiry(t.ExpiresAt)
	k := t.Key()
	was, is := old != nil && old.State == store.TaskPending, t.State == store.TaskPending
	if was && (!is || old.Account != t.Account) {
		w.counted = append(w.counted, countDelta{provider: k.Provider, account: old.Account, task: true, n: -1})
	}
	if is && (!was || old.Account != t.Account) {
		w.counted = append(w.counted, countDelta{provider: k.Provider, account: t.Account, task: true, n: 1})
	}
	if was && (!is || !old.SubmittedAt.Equal(t.SubmittedAt)) {
		w.trackPending(old, -1)
	}
	if is && (!was || !old.SubmittedAt.Equal(t.SubmittedAt)) {
		w.trackPending(t, 1)
	}
	pk := pollKey(t)
	if old != nil {
		if ok := pollKey(old); ok != nil && !bytes.Equal(ok, pk) {
			w.del(ok)
		}
	}
	if pk != nil {
		w.set(pk, nil, exp)
	}
	w.writeTaskOrder(old, t, exp)
	w.set(taskKey(k), val, exp)
	return nil
}
