package badgerstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// The received-time index (format 4):
//
//	i/<provider>/<8-byte big-endian ReceivedAt unix ns><id> → empty
//
// one key per record, written in the insert's transaction with the
// record's TTL and deleted with it (Expire, Purge). ListPage merges the
// providers' runs of it, so a page costs what it holds.
const receivedPrefix = "i/"

// receivedIndexKey is the i/ entry of the record under k received at at.
func receivedIndexKey(k store.Key, at time.Time) []byte {
	b := make([]byte, 0, len(receivedPrefix)+len(k.Provider)+1+8+len(k.ID))
	b = append(b, receivedPrefix...)
	b = append(b, k.Provider...)
	b = append(b, '/')
	b = binary.BigEndian.AppendUint64(b, store.UnixNano(at))
	return append(b, k.ID...)
}

// parseReceivedKey splits an i/ key.
func parseReceivedKey(k []byte) (store.Position, bool) {
	rest := k[len(receivedPrefix):]
	i := slices.Index(rest, '/')
	if i < 0 || len(rest) < i+1+8 {
		return store.Position{}, false
	}
	at := time.Unix(0, int64(binary.BigEndian.Uint64(rest[i+1:]))).UTC()
	return store.Position{ReceivedAt: at, Key: store.Key{Provider: string(rest[:i]), ID: string(rest[i+1+8:])}}, true
}

// gatherCap is how many keys of a state ListPage gathers for q (unless
// Options.gatherMax says otherwise, in tests): it gathers when the state
// index holds at most max(200, √((limit+1)·n)) entries, n the records of
// the provider (or all): gathering costs what the state holds, walking the
// received-time index about limit·n/held, so either way a page reads at
// most about √((limit+1)·n) entries (10 000 for a page of 100 among a
// million).
func (b *Badger) gatherCap(q store.ListQuery) int {
	if b.gatherMax != nil {
		return *b.gatherMax
	}
	c := b.counts.snapshot()
	var n int64
	for p, m := range c.Records {
		if q.Provider == "" || p == q.Provider {
			for _, k := range m {
				n += k
			}
		}
	}
	return max(200, int(math.Sqrt(float64(int64(q.Limit+1)*n))))
}

// ListPage implements Lister.
func (b *Badger) ListPage(ctx context.Context, q store.ListQuery) (store.Page, error) {
	if err := store.CheckLimit(q.Limit); err != nil {
		return store.Page{}, err
	}
	var out []*store.Record
	err := b.view(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		if q.State != "" && q.State != store.StateDelivered {
			keys, small, err := w.stateKeys(ctx, q, b.gatherCap(q))
			if err != nil {
				return err
			}
			if small {
				return w.gather(ctx, q, keys, &out)
			}
		}
		return w.walkReceived(ctx, q, &out)
	})
	if err != nil {
		return store.Page{}, err
	}
	return store.PageFrom(out, q.Limit), nil
}

// stateKeys returns the keys the state index holds for q's state and
// provider, and whether they are at most limit (it stops after one more).
func (w *batch) stateKeys(ctx context.Context, q store.ListQuery, limit int) ([]store.Key, bool, error) {
	var keys []store.Key
	var prefix string
	var parse func(k []byte) (store.Key, bool)
	if q.State == store.StateForwarding {
		prefix = leasePrefix
		parse = func(k []byte) (store.Key, bool) { _, _, key, ok := parseLeaseKey(k); return key, ok }
	} else {
		prefix = statePrefix + string(q.State) + "/"
		if q.Provider != "" {
			prefix += q.Provider + "/"
		}
		n := len(statePrefix) + len(q.State) + 1
		parse = func(k []byte) (store.Key, bool) { return parseTail(k[n:]) }
	}
	err := w.scan(prefix, func(k []byte) bool {
		if key, ok := parse(k); ok && (q.Provider == "" || key.Provider == q.Provider) {
			keys = append(keys, key)
		}
		return len(keys) <= limit && ctx.Err() == nil
	})
	if err == nil {
		err = ctx.Err()
	}
	return keys, len(keys) <= limit, err
}

// gather reads the received time and state of the records under keys
// (not the whole records), keeps those q matches and appends the first
// q.Limit+1 of them, read whole, in order, to out.
func (w *batch) gather(ctx context.Context, q store.ListQuery, keys []store.Key, out *[]*store.Record) error {
	slices.SortFunc(keys, store.CompareKeys)
	keys = slices.Compact(keys)
	var pos []store.Position
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		p, ok, err := w.position(k)
		if err != nil {
			return err
		}
		if !ok || !matches(&q, p) {
			continue
		}
		d, _, err := w.delivery(k)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if d.State == q.State {
			pos = append(pos, p)
		}
	}
	slices.SortFunc(pos, store.ComparePosition)
	for _, p := range pos[:min(len(pos), q.Limit+1)] {
		rec, err := w.record(p.Key)
		if err != nil {
			return err
		}
		*out = append(*out, rec)
	}
	return nil
}

// position returns the position of the record under k, decoding only the
// start of its value; ok is false if there is none.
func (w *batch) position(k store.Key) (store.Position, bool, error) {
	at, err := w.receivedAt(k)
	if errors.Is(err, store.ErrNotFound) {
		return store.Position{}, false, nil
	}
	if err != nil {
		return store.Position{}, false, fmt.Errorf("decoding record %s: %w", k, err)
	}
	return store.Position{ReceivedAt: at, Key: k}, true, nil
}

// walkReceived merges the received-time runs of q's providers from q's
// start and appends the first q.Limit+1 records q matches to out.
func (w *batch) walkReceived(ctx context.Context, q store.ListQuery, out *[]*store.Record) error {
	providers := []string{q.Provider}
	if q.Provider == "" {
		providers = w.receivedProviders()
	}
	start := q.ReceivedAfter
	if q.After != nil && store.UnixNano(q.After.ReceivedAt) > store.UnixNano(start) {
		start = q.After.ReceivedAt
	}
	starts := make([]runStart, 0, len(providers))
	for _, p := range providers {
		starts = append(starts, runStart{[]byte(receivedPrefix + p + "/"), receivedIndexKey(store.Key{Provider: p}, start)})
	}
	return mergeRuns(ctx, w.txn, starts, parseReceivedKey, store.ComparePosition, func(pos store.Position) (bool, error) {
		if !q.ReceivedBefore.IsZero() && store.UnixNano(pos.ReceivedAt) >= store.UnixNano(q.ReceivedBefore) {
			return false, nil // every run is past it from here on
		}
		if !matches(&q, pos) {
			return true, nil
		}
		if q.State != "" {
			d, _, err := w.delivery(pos.Key)
			if errors.Is(err, store.ErrNotFound) {
				return true, nil
			}
			if err != nil {
				return false, err
			}
			if d.State != q.State {
				return true, nil
			}
		}
		rec, err := w.record(pos.Key)
		if errors.Is(err, store.ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		*out = append(*out, rec)
		return len(*out) <= q.Limit, nil
	})
}

// receivedProviders lists the providers the received-time index holds,
// one seek each.
func (w *batch) receivedProviders() []string { return w.segments(receivedPrefix) }

// segments lists the distinct first segments (up to a '/') of the keys
// under prefix, one seek each.
func (w *batch) segments(prefix string) []string {
	it := w.txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix)})
	defer it.Close()
	var out []string
	for it.Seek([]byte(prefix)); it.Valid(); {
		rest := it.Item().Key()[len(prefix):]
		i := slices.Index(rest, '/')
		if i < 0 {
			it.Next()
			continue
		}
		p := string(rest[:i])
		out = append(out, p)
		it.Seek([]byte(prefix + p + "0")) // '0' follows '/': past every key of p
	}
	return out
}

// matches reports whether a record at pos is on a page of q: its
// provider, the received-time range and the cursor (not the state).
func matches(q *store.ListQuery, pos store.Position) bool {
	switch {
	case q.Provider != "" && pos.Key.Provider != q.Provider,
		!q.ReceivedAfter.IsZero() && store.UnixNano(pos.ReceivedAt) < store.UnixNano(q.ReceivedAfter),
		!q.ReceivedBefore.IsZero() && store.UnixNano(pos.ReceivedAt) >= store.UnixNano(q.ReceivedBefore),
		q.After != nil && store.ComparePosition(pos, *q.After) <= 0:
		return false
	}
	return true
}
