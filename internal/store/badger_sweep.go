package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
	"go.uber.org/zap"
)

// bucketPrefix holds the expiry buckets of delivered records (store format
// 8):
//
//	e/<second><provider> → 8-byte big-endian count
//
// where second is 8 big-endian bytes of Unix seconds: how many of
// provider's delivered records expire at that second. Badger drops an
// expired record by its TTL, without a transaction; the sweep
// (sweepExpired) takes each bucket whose second has come out of the
// delivered count and deletes it, so that the persisted counts stay true
// across expiry. Buckets have no TTL: only the sweep removes them.
const bucketPrefix = "e/"

// sweepEvery is how often the sweep loop looks for an expired bucket (one
// seek) and, if it finds one, sweeps.
const sweepEvery = time.Second

// bucketKey names an expiry bucket.
type bucketKey struct {
	sec      uint64
	provider string
}

func (k bucketKey) key() []byte {
	b := make([]byte, 0, len(bucketPrefix)+8+len(k.provider))
	b = append(b, bucketPrefix...)
	b = binary.BigEndian.AppendUint64(b, k.sec)
	return append(b, k.provider...)
}

// parseBucketKey splits an e/ key.
func parseBucketKey(k []byte) (bucketKey, bool) {
	if len(k) <= len(bucketPrefix)+8 {
		return bucketKey{}, false
	}
	return bucketKey{sec: binary.BigEndian.Uint64(k[len(bucketPrefix):]), provider: string(k[len(bucketPrefix)+8:])}, true
}

// countState is the committer's account of the persisted counts during one
// commit: the bucket changes of the operations applied so far and the
// second swept up to. The commit writes both the changed buckets and the
// changed record counts before it commits (countWrites); swept becomes
// the store's once the commit succeeded.
type countState struct {
	swept   uint64
	buckets map[bucketKey]int64
	sums    map[countSum]int64
}

// countSum names one record count.
type countSum struct {
	provider string
	state    State
}

// reset starts the account of a commit.
func (cs *countState) reset(swept uint64) {
	if cs.buckets == nil {
		cs.buckets, cs.sums = map[bucketKey]int64{}, map[countSum]int64{}
	}
	clear(cs.buckets)
	clear(cs.sums)
	cs.swept = swept
}

// note adds the bucket changes of an operation that succeeded.
func (cs *countState) note(ds []countDelta) {
	for _, d := range ds {
		if !d.task && d.state == StateDelivered && d.exp > 0 {
			cs.buckets[bucketKey{sec: d.exp, provider: d.provider}] += d.n
		}
	}
}

// stored reads a bucket as the transaction holds it before the commit's
// own changes (which only countWrites writes): 0 if there is none.
func stored(txn *badger.Txn, k bucketKey) (int64, error) {
	item, err := txn.Get(k.key())
	if errors.Is(err, badger.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var n int64
	err = item.Value(func(v []byte) error {
		if len(v) == 8 {
			n = int64(binary.BigEndian.Uint64(v))
		}
		return nil
	})
	return n, err
}

// countWrites are the writes that persist a commit's count changes
// (counted: the changes of every operation that succeeded): each changed
// record count as its new value (current, from counts, plus the changes),
// each changed bucket likewise.
func (cs *countState) countWrites(txn *badger.Txn, counted []countDelta, counts *memCounts) ([]write, error) {
	for _, d := range counted {
		if !d.task {
			cs.sums[countSum{d.provider, d.state}] += d.n
		}
	}
	var ws []write
	for s, n := range cs.sums {
		if n != 0 {
			ws = append(ws, countValue(countKey(s.provider, s.state), counts.record(s.provider, s.state)+n))
		}
	}
	for k, n := range cs.buckets {
		if n == 0 {
			continue
		}
		base, err := stored(txn, k)
		if err != nil {
			return nil, err
		}
		ws = append(ws, countValue(k.key(), base+n))
	}
	return ws, nil
}

// sweep takes every bucket up to the second now (stored, or made by an
// earlier operation of the batch) out of the delivered count, which
// deletes it, and makes now the second swept up to.
func (w *batch) sweep(now uint64) error {
	cs := w.cs
	var keys []bucketKey
	err := w.scan(bucketPrefix, func(k []byte) bool {
		bk, ok := parseBucketKey(k)
		if ok && bk.sec > now {
			return false
		}
		if ok {
			keys = append(keys, bk)
		}
		return true
	})
	if err != nil {
		return err
	}
	for k, n := range cs.buckets {
		if base, err := stored(w.txn, k); err == nil && base == 0 && n != 0 && k.sec <= now {
			keys = append(keys, k) // made in this batch, not stored yet
		} else if err != nil {
			return err
		}
	}
	for _, k := range keys {
		base, err := stored(w.txn, k)
		if err != nil {
			return err
		}
		if n := base + cs.buckets[k]; n != 0 {
			w.counted = append(w.counted, countDelta{provider: k.provider, state: StateDelivered, n: -n, exp: k.sec})
		}
	}
	cs.swept = max(cs.swept, now)
	return nil
}

// sweepExpired takes the delivered records whose retention has ended out of
// the counts, as one deferrable operation of the committer.
func (b *Badger) sweepExpired(ctx context.Context) error {
	return b.submit(ctx, &op{size: 256, lazy: true, apply: func(w *batch) error {
		return w.sweep(uint64(time.Now().Unix()))
	}})
}

// bucketDue reports whether the earliest expiry bucket's second has come
// (one seek).
func (b *Badger) bucketDue() bool {
	due := false
	_ = b.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(bucketPrefix)})
		defer it.Close()
		it.Rewind()
		if it.Valid() {
			k, ok := parseBucketKey(it.Item().Key())
			due = ok && k.sec <= uint64(time.Now().Unix())
		}
		return nil
	})
	return due
}

// sweepLoop sweeps every sweepEvery that a bucket is due, until the store
// stops. A sweep that fails (the disk below min_free_space, which the
// space guard reports itself, or a failed commit) is logged and tried
// again at the next tick: the records' count stays until it succeeds.
func (b *Badger) sweepLoop() {
	defer close(b.sweepDone)
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-b.stopGC:
			return
		case <-t.C:
			if !b.bucketDue() {
				continue
			}
			err := b.sweepExpired(context.Background())
			if err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrUnavailable) {
				b.log.Warn("counting out expired delivered records failed; trying again", zap.Error(err))
			}
		}
	}
}

// checkCounts (SelfCheck, at open) compares the persisted counts with what
// the keys say, and panics if they disagree: the delivered counts must be
// equal, once the buckets whose second has come (which the sweep has yet
// to take) are taken out; another state's persisted count may be higher,
// by records whose retention ended and which Expire has not counted out
// yet. A check that a second boundary crossed is run again.
func (b *Badger) checkCounts() error {
	for {
		start := uint64(time.Now().Unix())
		var scanned *memCounts
		due := map[string]int64{}
		if err := b.view(func(txn *badger.Txn) error {
			var err error
			if scanned, err = countKeys(&batch{txn: txn}, nil); err != nil {
				return err
			}
			w := &batch{txn: txn}
			return w.scan(bucketPrefix, func(k []byte) bool {
				bk, ok := parseBucketKey(k)
				if !ok || bk.sec > start {
					return false
				}
				n, err := stored(txn, bk)
				if err == nil {
					due[bk.provider] += n
				}
				return true
			})
		}); err != nil {
			return err
		}
		if uint64(time.Now().Unix()) != start {
			continue
		}
		persisted := b.counts.snapshot().Records
		for p, n := range due {
			addCount(persisted, p, StateDelivered, -n)
		}
		bad := ""
		for p, states := range scanned.snapshot().Records {
			for s, n := range states {
				if got := persisted[p][s]; got < n || (s == StateDelivered && got != n) {
					bad = fmt.Sprintf("%s %s: persisted %d, keys %d", p, s, got, n)
				}
			}
		}
		for p, states := range persisted {
			if n := states[StateDelivered]; n != scanned.records[p][StateDelivered] {
				bad = fmt.Sprintf("%s delivered: persisted %d, keys %d", p, n, scanned.records[p][StateDelivered])
			}
		}
		if bad != "" {
			panic("store: persisted counts disagree with the keys: " + bad)
		}
		return nil
	}
}
