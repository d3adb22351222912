package badgerstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// countPrefix holds the persisted record counts (store format 8):
//
//	m/count/<provider>/<state> → 8-byte big-endian count of its records in the state
//
// Every committed batch that changes a count rewrites the counts it
// changed in the same transaction (and so in the same journal record), as
// absolute values: replaying a journal record sets them again, never
// twice. A count that reaches 0 is deleted.
const countPrefix = "m/count/"

// Counts implements Counter. Badger keeps the counts in memory, read from
// the persisted counts (m/count/) when the store opens, then moved by every
// committed batch by the state changes its operations wrote, which the
// batch persists as well. A record whose retention ends leaves Badger by
// its TTL, without a transaction of its own: each record with an expiry is
// also counted under its expiry second and state ([bucketPrefix]), and
// leaves its state's count within about a second of that moment, by a
// sweep, whatever its state (Expire then only reports and forgets what is
// left of the undelivered ones). Pending tasks are counted when the store
// opens, from their task order entries.
func (b *Badger) Counts(ctx context.Context) (store.Counts, error) {
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return store.Counts{}, store.ErrClosed
	}
	return b.counts.snapshot(), nil
}

// countRecord notes that a record of provider enters (n = 1) or leaves
// (n = -1) state; exp is the record's expiry (Unix seconds, 0 for none).
// The change also moves the record's expiry bucket, unless the bucket's
// second has been swept already: the record then left the count at its
// expiry, and whatever removes what is left of it (Expire, a purge) must
// not count it out again.
func (w *batch) countRecord(provider string, state store.State, n int64, exp uint64) {
	if w.cs != nil && exp > 0 && exp <= w.cs.swept {
		return
	}
	w.counted = append(w.counted, countDelta{provider: provider, state: state, n: n, exp: exp})
}

// readCounts reads the counts when a store of format 8 opens: the
// persisted record counts, and the pending tasks from the pending runs of
// the task order o/ (a pending task that leaves Badger by its TTL stays
// counted until the next open, as before).
func readCounts(w *batch) (*memCounts, error) {
	c := newMemCounts()
	var ds []countDelta
	it := w.txn.NewIterator(badger.IteratorOptions{Prefix: []byte(countPrefix)})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		provider, state, ok := strings.Cut(string(item.Key()[len(countPrefix):]), "/")
		if !ok {
			continue
		}
		if err := item.Value(func(v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("count %q of %d bytes", item.Key(), len(v))
			}
			ds = append(ds, countDelta{provider: provider, state: store.State(state), n: int64(binary.BigEndian.Uint64(v))})
			return nil
		}); err != nil {
			return nil, err
		}
	}
	pending, err := pendingTaskDeltas(w)
	if err != nil {
		return nil, err
	}
	c.apply(append(ds, pending...))
	return c, nil
}

// countKeys counts what the store holds from its keys alone (no value is
// read), as readCounts would find it: records by r/, their states by the
// state index v/ (queued, failed, rejected, parked, quarantined,
// expired) and the lease index l/ (forwarding), the rest delivered;
// pending tasks by the task order. The format 8 upgrade persists what it counts; tests
// (SelfCheck) compare it with the persisted counts at each open. If
// buckets is not nil, every record with an expiry is also counted in the
// bucket of its expiry second and state.
func countKeys(w *batch, buckets map[bucketKey]int64) (*memCounts, error) {
	c := newMemCounts()
	// The states of the undelivered records, then one pass over the
	// records: a record that expires between the passes is counted in
	// none (its index entries expire with it).
	undelivered := map[string]store.State{}
	if err := w.scan(statePrefix, func(k []byte) bool {
		if state, tail, ok := strings.Cut(string(k[len(statePrefix):]), "/"); ok {
			undelivered[tail] = store.State(state)
		}
		return true
	}); err != nil {
		return nil, err
	}
	if err := w.scan(leasePrefix, func(k []byte) bool {
		if _, _, key, ok := parseLeaseKey(k); ok {
			undelivered[key.Provider+"/"+key.ID] = store.StateForwarding
		}
		return true
	}); err != nil {
		return nil, err
	}
	var ds []countDelta
	it := w.txn.NewIterator(badger.IteratorOptions{Prefix: []byte(recordPrefix)})
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		tail := item.Key()[len(recordPrefix):]
		key, ok := parseTail(tail)
		if !ok {
			continue
		}
		state, ok := undelivered[string(tail)]
		if !ok {
			state = store.StateDelivered
		}
		ds = append(ds, countDelta{provider: key.Provider, state: state, n: 1})
		if exp := item.ExpiresAt(); buckets != nil && exp > 0 {
			buckets[bucketKey{sec: exp, provider: key.Provider, state: state}]++
		}
	}
	it.Close()
	pending, err := pendingTaskDeltas(w)
	if err != nil {
		return nil, err
	}
	c.apply(append(ds, pending...))
	return c, nil
}

// pendingTaskDeltas counts the pending tasks by provider and account, from
// the pending runs of the task order o/.
func pendingTaskDeltas(w *batch) ([]countDelta, error) {
	var ds []countDelta
	err := w.scan(pendingOrderPrefix, func(k []byte) bool {
		if provider, account, _, _, ok := splitAccountTimeKey(k[len(pendingOrderPrefix):]); ok {
			ds = append(ds, countDelta{provider: provider, account: account, task: true, n: 1})
		}
		return true
	})
	return ds, err
}

// countKey is the m/count/ key of provider's records in state.
func countKey(provider string, state store.State) []byte {
	return []byte(countPrefix + provider + "/" + string(state))
}

// countValue is a count as stored: a set of its 8 big-endian bytes, or a
// deletion for a count that is 0 (or below, which no change leaves).
func countValue(key []byte, n int64) write {
	if n <= 0 {
		return write{key: key, del: true}
	}
	return write{key: key, val: binary.BigEndian.AppendUint64(nil, uint64(n))}
}

// persistCounts writes the counts of a store of an earlier format (one
// scan of the record keys, no value read): the record counts and the
// expiry buckets, after deleting whatever an upgrade
// cut short left of them. Running it again is harmless. It returns the
// number of records counted.
func persistCounts(db badgerDB) (int64, error) {
	var ws []write
	var n int64
	err := db.View(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		for _, prefix := range []string{countPrefix, bucketPrefix} {
			if err := w.scan(prefix, func(k []byte) bool {
				ws = append(ws, write{key: append([]byte(nil), k...), del: true})
				return true
			}); err != nil {
				return err
			}
		}
		buckets := map[bucketKey]int64{}
		c, err := countKeys(w, buckets)
		if err != nil {
			return err
		}
		for p, states := range c.records {
			for s, v := range states {
				ws = append(ws, countValue(countKey(p, s), v))
				n += v
			}
		}
		for k, v := range buckets {
			ws = append(ws, countValue(k.key(), v))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, inChunks(db, len(ws), 1000, func(w *batch, i int) { w.writes = append(w.writes, ws[i]) })
}
