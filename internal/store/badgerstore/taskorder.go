package badgerstore

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// The task order index (format 5; by account since format 7):
//
//	o/<state>/<provider>/<account>/<8-byte big-endian SubmittedAt unix ns><id> → empty
//
// one key per task, written by writeTask in the task's own transaction
// with the task's TTL, moved when its state, account or submission time
// changes, deleted with it (Purge). ListTaskPage merges the runs of the
// (state, provider, account) triples q selects, so a page costs what it
// holds whatever the filters (plus one seek per run). The pending runs
// also give the pending counts when the store opens (countKeys).
const taskOrderPrefix = "o/"

// pendingOrderPrefix is where the runs of the pending tasks are.
const pendingOrderPrefix = taskOrderPrefix + string(store.TaskPending) + "/"

// taskOrderKey is the o/ entry of t.
func taskOrderKey(t *store.Task) []byte {
	b := taskOrderRun(t.State, t.Provider, t.Account)
	b = binary.BigEndian.AppendUint64(b, store.UnixNano(t.SubmittedAt))
	return append(b, t.ID...)
}

// taskOrderRun is the prefix of the run of (state, provider, account).
func taskOrderRun(state store.TaskState, provider, account string) []byte {
	b := make([]byte, 0, len(taskOrderPrefix)+len(state)+len(provider)+len(account)+3+8+16)
	b = append(b, taskOrderPrefix...)
	b = append(b, state...)
	b = append(b, '/')
	b = append(b, provider...)
	b = append(b, '/')
	b = append(b, account...)
	return append(b, '/')
}

// taskOrderStart is where the run of (state, provider, account) reaches
// at.
func taskOrderStart(state store.TaskState, provider, account string, at time.Time) []byte {
	return taskOrderKey(&store.Task{State: state, Provider: provider, Account: account, SubmittedAt: at})
}

// parseTaskOrderKey splits an o/ key.
func parseTaskOrderKey(k []byte) (store.TaskPosition, bool) {
	rest := k[len(taskOrderPrefix):]
	i := slices.Index(rest, '/')
	if i < 0 {
		return store.TaskPosition{}, false
	}
	provider, _, at, id, ok := splitAccountTimeKey(rest[i+1:])
	return store.TaskPosition{SubmittedAt: at, Key: store.Key{Provider: provider, ID: id}}, ok
}

// writeTaskOrder moves the o/ entry of old (nil for a new task) to t's.
func (w *batch) writeTaskOrder(old, t *store.Task, exp uint64) {
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

// ListTaskPage implements TaskStore: a merge of the o/ runs of q's
// states, providers and accounts, each from q.After's submission time on.
func (b *Badger) ListTaskPage(ctx context.Context, q store.TaskQuery) (store.TaskPage, error) {
	if err := store.CheckLimit(q.Limit); err != nil {
		return store.TaskPage{}, err
	}
	var out []*store.Task
	err := b.view(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		return w.walkTaskOrder(ctx, q, &out)
	})
	if err != nil {
		return store.TaskPage{}, err
	}
	return store.TaskPageFrom(out, q.Limit), nil
}

// walkTaskOrder appends the first q.Limit+1 tasks q selects to out, in
// order.
func (w *batch) walkTaskOrder(ctx context.Context, q store.TaskQuery, out *[]*store.Task) error {
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
			accounts := []string{q.Account}
			if q.Account == "" {
				accounts = w.segments(taskOrderPrefix + s + "/" + p + "/")
			}
			for _, a := range accounts {
				starts = append(starts, runStart{taskOrderRun(store.TaskState(s), p, a), taskOrderStart(store.TaskState(s), p, a, start)})
			}
		}
	}
	return mergeRuns(ctx, w.txn, starts, parseTaskOrderKey, store.CompareTaskPosition, func(pos store.TaskPosition) (bool, error) {
		if q.After != nil && store.CompareTaskPosition(pos, *q.After) <= 0 {
			return true, nil
		}
		t, err := w.task(pos.Key)
		if errors.Is(err, store.ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		*out = append(*out, t)
		return len(*out) <= q.Limit, nil
	})
}
