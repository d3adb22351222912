package badgerstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/caddy-pingback/pingback/internal/store"
)

// historyPrefix holds the history's minute records (store.HistoryStore):
// "h/<minute>/<instance>" → the record's JSON, the minute in Unix seconds
// on 12 digits so that the keys sort by time. One key per instance and
// minute, deleted by PruneMinutes (the app prunes them with retention), so
// that their number stays bounded by the instances and minutes of a
// retention.
const historyPrefix = "h/"

// historyPruneChunk is how many minute records one prune commit deletes.
const historyPruneChunk = 512

func historyKey(minute time.Time, instance string) []byte {
	return fmt.Appendf(nil, "%s%012d/%s", historyPrefix, minute.Unix(), instance)
}

// parseHistoryKey returns the minute and instance of a history key.
func parseHistoryKey(k []byte) (time.Time, string, bool) {
	rest, ok := strings.CutPrefix(string(k), historyPrefix)
	if !ok {
		return time.Time{}, "", false
	}
	sec, inst, ok := strings.Cut(rest, "/")
	n, err := strconv.ParseInt(sec, 10, 64)
	if !ok || err != nil {
		return time.Time{}, "", false
	}
	return time.Unix(n, 0).UTC(), inst, true
}

// WriteMinute implements store.HistoryStore: one group-committed write.
func (b *Badger) WriteMinute(ctx context.Context, m store.HistoryMinute) error {
	val, err := json.Marshal(m)
	if err != nil {
		return err
	}
	key := historyKey(m.Minute.UTC().Truncate(time.Minute), m.Instance)
	return b.submit(ctx, &op{size: len(key) + len(val), lazy: true, apply: func(w *batch) error {
		w.set(key, val, 0)
		return nil
	}})
}

// Minutes implements store.HistoryStore: one scan of the history keys
// from from's minute to to's.
func (b *Badger) Minutes(ctx context.Context, from, to time.Time) ([]store.HistoryMinute, error) {
	var out []store.HistoryMinute
	start, end := historyKey(from.UTC(), ""), historyKey(to.UTC(), "")
	err := b.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(historyPrefix), PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Seek(start); it.Valid(); it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			k := it.Item().Key()
			if string(k) >= string(end) {
				return nil
			}
			minute, inst, ok := parseHistoryKey(k)
			if !ok || minute.Before(from) {
				continue
			}
			m := store.HistoryMinute{Minute: minute, Instance: inst}
			if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, &m) }); err != nil {
				return fmt.Errorf("history minute %s: %w", k, err)
			}
			out = append(out, m)
		}
		return nil
	})
	return out, err
}

// PruneMinutes implements store.HistoryStore, one commit per
// historyPruneChunk records.
func (b *Badger) PruneMinutes(ctx context.Context, before time.Time) (int, error) {
	end := historyKey(before.UTC(), "")
	n := 0
	for {
		var keys [][]byte
		err := b.view(func(txn *badger.Txn) error {
			return (&batch{txn: txn}).scan(historyPrefix, func(k []byte) bool {
				if string(k) >= string(end) || len(keys) == historyPruneChunk {
					return false
				}
				keys = append(keys, append([]byte(nil), k...))
				return true
			})
		})
		if err != nil || len(keys) == 0 {
			return n, err
		}
		err = b.submit(ctx, &op{size: 64 * len(keys), apply: func(w *batch) error {
			for _, k := range keys {
				w.del(k)
			}
			return nil
		}})
		if err != nil {
			return n, err
		}
		n += len(keys)
		if len(keys) < historyPruneChunk {
			return n, nil
		}
	}
}

// Interface guards
var _ store.HistoryStore = (*Badger)(nil)
