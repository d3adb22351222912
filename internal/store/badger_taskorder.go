package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// The task order index (format 5):
//
//	o/<state>/<provider>/<8-byte big-endian SubmittedAt unix ns><id> → empty
//
// one key per task, written by writeTask in the task's own transaction
// with the task's TTL, moved when its state or submission time changes,
// deleted with it (Purge). ListTaskPage merges the runs of the (state,
// provider) pairs q selects, so a page costs what it holds whatever the
// filters.
const taskOrderPrefix = "o/"

// taskOrderKey is the o/ entry of t.
func taskOrderKey(t *Task) []byte {
	b := make([]byte, 0, len(taskOrderPrefix)+len(t.State)+len(t.Provider)+2+8+len(t.ID))
	b = append(b, taskOrderPrefix...)
	b = append(b, t.State...)
	b = append(b, '/')
	b = append(b, t.Provider...)
	b = append(b, '/')
	b = binary.BigEndian.AppendUint64(b, unixNano(t.SubmittedAt))
	return append(b, t.ID...)
}

// taskOrderStart is where the run of (state, provider) reaches at.
func taskOrderStart(state TaskState, provider string, at time.Time) []byte {
	return taskOrderKey(&Task{State: state, Provider: provider, SubmittedAt: at})
}

// parseTaskOrderKey splits an o/ key.
func parseTaskOrderKey(k []byte) (TaskPosition, bool) {
	rest := k[len(taskOrderPrefix):]
	i := slices.Index(rest, '/')
	if i < 0 {
		return TaskPosition{}, false
	}
	rest = rest[i+1:]
	j := slices.Index(rest, '/')
	if j < 0 || len(rest) < j+1+8 {
		return TaskPosition{}, false
	}
	at := time.Unix(0, int64(binary.BigEndian.Uint64(rest[j+1:]))).UTC()
	return TaskPosition{SubmittedAt: at, Key: Key{Provider: string(rest[:j]), ID: string(rest[j+1+8:])}}, true
}

// writeTaskOrder moves the o/ entry of old (nil for a new task) to t's.
func (w *batch) writeTaskOrder(old, t *Task, exp uint64) {
	k := taskOrderKey(t)
	if old != nil {
		ok := taskOrderKey(old)
		if string(ok) == string(k) && expiry(old.ExpiresAt) == exp {
			return
		}
		if string(ok) != string(k) {
			w.del(ok)
		}
	}
	w.set(k, nil, exp)
}

// ListTaskPage implements TaskStore: a merge of the o/ runs of q's states
// and providers, each from q.After's submission time on.
func (b *Badger) ListTaskPage(ctx context.Context, q TaskQuery) (TaskPage, error) {
	if err := checkLimit(q.Limit); err != nil {
		return TaskPage{}, err
	}
	var out []*Task
	err := b.view(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		return w.walkTaskOrder(ctx, q, &out)
	})
	if err != nil {
		return TaskPage{}, err
	}
	return taskPageFrom(out, q.Limit), nil
}

// walkTaskOrder appends the first q.Limit+1 tasks q selects to out, in
// order.
func (w *batch) walkTaskOrder(ctx context.Context, q TaskQuery, out *[]*Task) error {
	states := []string{string(q.State)}
	if q.State == "" {
		states = w.segments(taskOrderPrefix)
	}
	var start time.Time
	if q.After != nil {
		start = q.After.SubmittedAt
	}
	var starts []runStart
	for _, s := range states {
		providers := []string{q.Provider}
		if q.Provider == "" {
			providers = w.segments(taskOrderPrefix + s + "/")
		}
		for _, p := range providers {
			starts = append(starts, runStart{[]byte(taskOrderPrefix + s + "/" + p + "/"), taskOrderStart(TaskState(s), p, start)})
		}
	}
	return mergeRuns(ctx, w.txn, starts, parseTaskOrderKey, CompareTaskPosition, func(pos TaskPosition) (bool, error) {
		if q.After != nil && CompareTaskPosition(pos, *q.After) <= 0 {
			return true, nil
		}
		t, err := w.task(pos.Key)
		if errors.Is(err, ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		*out = append(*out, t)
		return len(*out) <= q.Limit, nil
	})
}

// buildTaskOrder writes the o/ entry of every task, with the task's TTL
// (stores of format 4 and earlier had none). Running it again is
// harmless.
func buildTaskOrder(db badgerDB) (int, error) {
	var keys [][]byte
	var exps []uint64
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(taskPrefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			var t Task
			if err := item.Value(func(v []byte) error { return decodeTask(v, &t) }); err != nil {
				return fmt.Errorf("decoding task %s: %w", item.Key(), err)
			}
			keys, exps = append(keys, taskOrderKey(&t)), append(exps, item.ExpiresAt())
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(keys), inChunks(db, len(keys), 1000, func(w *batch, i int) { w.set(keys[i], nil, exps[i]) })
}
