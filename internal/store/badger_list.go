package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

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
func receivedIndexKey(k Key, at time.Time) []byte {
	b := make([]byte, 0, len(receivedPrefix)+len(k.Provider)+1+8+len(k.ID))
	b = append(b, receivedPrefix...)
	b = append(b, k.Provider...)
	b = append(b, '/')
	b = binary.BigEndian.AppendUint64(b, unixNano(at))
	return append(b, k.ID...)
}

// parseReceivedKey splits an i/ key.
func parseReceivedKey(k []byte) (Position, bool) {
	rest := k[len(receivedPrefix):]
	i := slices.Index(rest, '/')
	if i < 0 || len(rest) < i+1+8 {
		return Position{}, false
	}
	at := time.Unix(0, int64(binary.BigEndian.Uint64(rest[i+1:]))).UTC()
	return Position{ReceivedAt: at, Key: Key{Provider: string(rest[:i]), ID: string(rest[i+1+8:])}}, true
}

// gatherMax, if not negative, replaces the number of records of a state
// ListPage gathers, read and sorted (tests set it to walk every time).
// By default ListPage gathers when the state index holds at most
// max(200, √((limit+1)·n)) entries, n the records of the provider (or all):
// gathering costs what the state holds, walking the received-time index
// about limit·n/held, so either way a page reads at most about
// √((limit+1)·n) entries (10 000 for a page of 100 among a million).
var gatherMax = -1

// gatherCap is how many keys of a state ListPage gathers for q.
func (b *Badger) gatherCap(q ListQuery) int {
	if gatherMax >= 0 {
		return gatherMax
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
func (b *Badger) ListPage(ctx context.Context, q ListQuery) (Page, error) {
	if err := checkLimit(q.Limit); err != nil {
		return Page{}, err
	}
	var out []*Record
	err := b.view(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		if q.State != "" && q.State != StateDelivered {
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
		return Page{}, err
	}
	return pageFrom(out, q.Limit), nil
}

// stateKeys returns the keys the state index holds for q's state and
// provider, and whether they are at most limit (it stops after one more).
func (w *batch) stateKeys(ctx context.Context, q ListQuery, limit int) ([]Key, bool, error) {
	var keys []Key
	var prefix string
	var parse func(k []byte) (Key, bool)
	if q.State == StateForwarding {
		prefix = leasePrefix
		parse = func(k []byte) (Key, bool) { _, _, key, ok := parseLeaseKey(k); return key, ok }
	} else {
		prefix = statePrefix + string(q.State) + "/"
		if q.Provider != "" {
			prefix += q.Provider + "/"
		}
		n := len(statePrefix) + len(q.State) + 1
		parse = func(k []byte) (Key, bool) { return parseTail(k[n:]) }
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
func (w *batch) gather(ctx context.Context, q ListQuery, keys []Key, out *[]*Record) error {
	slices.SortFunc(keys, keyOrder)
	keys = slices.Compact(keys)
	var pos []Position
	for _, k := range keys {
		if err := ctx.Err(); err != nil {
			return err
		}
		p, ok, err := w.position(k)
		if err != nil {
			return err
		}
		if !ok || !q.matches(p) {
			continue
		}
		d, _, err := w.delivery(k)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if d.State == q.State {
			pos = append(pos, p)
		}
	}
	slices.SortFunc(pos, ComparePosition)
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
func (w *batch) position(k Key) (Position, bool, error) {
	at, err := w.receivedAt(k)
	if errors.Is(err, ErrNotFound) {
		return Position{}, false, nil
	}
	if err != nil {
		return Position{}, false, fmt.Errorf("decoding record %s: %w", k, err)
	}
	return Position{ReceivedAt: at, Key: k}, true, nil
}

// walkReceived merges the received-time runs of q's providers from q's
// start and appends the first q.Limit+1 records q matches to out.
func (w *batch) walkReceived(ctx context.Context, q ListQuery, out *[]*Record) error {
	providers := []string{q.Provider}
	if q.Provider == "" {
		providers = w.receivedProviders()
	}
	start := q.ReceivedAfter
	if q.After != nil && unixNano(q.After.ReceivedAt) > unixNano(start) {
		start = q.After.ReceivedAt
	}
	starts := make([]runStart, 0, len(providers))
	for _, p := range providers {
		starts = append(starts, runStart{[]byte(receivedPrefix + p + "/"), receivedIndexKey(Key{Provider: p}, start)})
	}
	return mergeRuns(ctx, w.txn, starts, parseReceivedKey, ComparePosition, func(pos Position) (bool, error) {
		if !q.ReceivedBefore.IsZero() && unixNano(pos.ReceivedAt) >= unixNano(q.ReceivedBefore) {
			return false, nil // every run is past it from here on
		}
		if !q.matches(pos) {
			return true, nil
		}
		if q.State != "" {
			d, _, err := w.delivery(pos.Key)
			if errors.Is(err, ErrNotFound) {
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
		if errors.Is(err, ErrNotFound) {
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
