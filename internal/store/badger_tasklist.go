package store

import (
	"context"
	"errors"

	"github.com/dgraph-io/badger/v4"
)

// ListTasks implements TaskStore: a scan of t/ (of the provider's keys
// when one is given), each task decoded and filtered by state.
func (b *Badger) ListTasks(ctx context.Context, provider string, state TaskState, limit int) ([]*Task, error) {
	prefix := taskPrefix
	if provider != "" {
		prefix += provider + "/"
	}
	var out []*Task
	err := b.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix), PrefetchValues: false})
		defer it.Close()
		for it.Rewind(); it.Valid() && len(out) < limit; it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			t := new(Task)
			if err := it.Item().Value(func(v []byte) error { return decodeTask(v, t) }); err != nil {
				return errors.Join(errors.New("decoding task "+string(it.Item().Key())), err)
			}
			if state == "" || t.State == state {
				out = append(out, t)
			}
		}
		return nil
	})
	return out, err
}
