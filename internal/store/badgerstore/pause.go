package badgerstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Pauses on Badger:
//
//	m/pause/<provider> → the store.Pause as JSON, without expiry
//
// written and deleted through the committer like every other write
// (journalled and synced before the call returns). A new key prefix: no
// format bump.
const pausePrefix = "m/pause/"

func pauseKey(provider string) []byte { return []byte(pausePrefix + provider) }

// PutPause implements store.Pauser.
func (b *Badger) PutPause(ctx context.Context, p store.Pause) (store.Pause, error) {
	var out store.Pause
	o := &op{size: 256, apply: func(w *batch) error {
		cur, err := w.pause(p.Provider)
		switch {
		case errors.Is(err, store.ErrNotFound):
			out = p
		case err != nil:
			return err
		default:
			out = cur
			out.Reason, out.Until = p.Reason, p.Until
		}
		v, err := json.Marshal(out)
		if err != nil {
			return err
		}
		w.set(pauseKey(p.Provider), v, 0)
		return nil
	}}
	if err := b.submit(ctx, o); err != nil {
		return store.Pause{}, err
	}
	return out, nil
}

// DeletePause implements store.Pauser.
func (b *Badger) DeletePause(ctx context.Context, provider string, dueBy time.Time) (store.Pause, error) {
	var out store.Pause
	o := &op{size: 64, apply: func(w *batch) error {
		cur, err := w.pause(provider)
		if err != nil {
			return err
		}
		if !dueBy.IsZero() && !cur.Due(dueBy) {
			return store.ErrNotFound
		}
		out = cur
		w.del(pauseKey(provider))
		return nil
	}}
	if err := b.submit(ctx, o); err != nil {
		return store.Pause{}, err
	}
	return out, nil
}

// ListPauses implements store.Pauser.
func (b *Badger) ListPauses(ctx context.Context) ([]store.Pause, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var out []store.Pause
	err := b.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(pausePrefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var p store.Pause
			if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &p) }); err != nil {
				return fmt.Errorf("decoding pause %s: %w", it.Item().Key(), err)
			}
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// pause reads the pause of provider, or ErrNotFound.
func (w *batch) pause(provider string) (store.Pause, error) {
	item, err := w.get(pauseKey(provider))
	if err != nil {
		return store.Pause{}, err
	}
	var p store.Pause
	err = item.Value(func(v []byte) error { return json.Unmarshal(v, &p) })
	return p, err
}

// Interface guards
var _ store.Pauser = (*Badger)(nil)
