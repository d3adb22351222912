package badgerstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
	"go.uber.org/zap"
)

// bucketPrefix holds the expiry buckets of the records (store format 8):
//
//	e/<second><provider>/<state> → 8-byte big-endian count
//
// where second is 8 big-endian bytes of Unix seconds: how many of
// provider's records in state expire at that second. Badger drops an
// expired record by its TTL, without a transaction; the sweep
// (sweepUntil) takes each bucket whose second has come out of its state's
// count and deletes it, so that the persisted counts stay true across
// expiry. Buckets have no TTL: only the sweep removes them.
const bucketPrefix = "e/"

// sweptKey holds the second the last sweep took every bucket up to
// (8 big-endian bytes of Unix seconds), so that an open after a step back
// of the wall clock does not count out again what was swept before it.
const sweptKey = "m/swept"

// sweepEvery is how often the sweep loop looks for a due bucket (one seek)
// and, if it finds one, sweeps.
const sweepEvery = time.Second

// sweepChunk is about how many buckets one sweep operation takes (whole
// seconds: every bucket of the last second it reaches): a store closed for
// days has that many seconds' worth due at its open, more than one
// transaction holds.
const sweepChunk = 1000

// bucketKey names an expiry bucket.
type bucketKey struct {
	sec      uint64
	provider string
	state    store.State
}

func (k bucketKey) key() []byte {
	b := make([]byte, 0, len(bucketPrefix)+8+len(k.provider)+1+len(k.state))
	b = append(b, bucketPrefix...)
	b = binary.BigEndian.AppendUint64(b, k.sec)
	return append(append(append(b, k.provider...), '/'), k.state...)
}

// parseBucketKey splits an e/ key.
func parseBucketKey(k []byte) (bucketKey, bool) {
	if len(k) <= len(bucketPrefix)+8 {
		return bucketKey{}, false
	}
	provider, state, ok := strings.Cut(string(k[len(bucketPrefix)+8:]), "/")
	if !ok || provider == "" || state == "" {
		return bucketKey{}, false
	}
	return bucketKey{sec: binary.BigEndian.Uint64(k[len(bucketPrefix):]), provider: provider, state: store.State(state)}, true
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
	state    store.State
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
		if !d.task && d.exp > 0 {
			cs.buckets[bucketKey{sec: d.exp, provider: d.provider, state: d.state}] += d.n
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
		if len(v) == 8 { // anything else is rewritten whole by the next change
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

// sweep takes the buckets due by the second now (stored, or made by an
// earlier operation of the batch) out of their states' counts, which
// deletes them: about sweepChunk of them, in whole seconds. It reports
// whether due buckets remain, and makes the last second it took whole the
// second swept up to. A malformed e/ key is deleted.
//
// The sweep follows the wall clock, as Badger's TTLs do: if the clock
// steps back, records whose TTL has not passed again stay out of the
// counts until it catches up (countRecord drops their changes meanwhile).
func (w *batch) sweep(now uint64) (more bool, err error) {
	cs := w.cs
	var keys []bucketKey
	var last uint64
	taken := 0 // keys taken, malformed ones included
	err = w.scan(bucketPrefix, func(k []byte) bool {
		bk, ok := parseBucketKey(k)
		switch {
		case !ok && taken < sweepChunk:
			w.del(append([]byte(nil), k...))
			taken++
			return true
		case !ok:
			more = true
			return false
		case bk.sec > now:
			return false
		case taken >= sweepChunk && bk.sec != last:
			more = true
			return false
		}
		keys, last = append(keys, bk), bk.sec
		taken++
		return true
	})
	if err != nil {
		return false, err
	}
	upto := now
	if more {
		upto = last
	}
	scanned := make(map[bucketKey]bool, len(keys))
	for _, k := range keys {
		scanned[k] = true
	}
	for k, n := range cs.buckets {
		if n != 0 && k.sec <= upto && !scanned[k] {
			keys = append(keys, k) // made in this batch, not stored yet
		}
	}
	for _, k := range keys {
		base, err := stored(w.txn, k)
		if err != nil {
			return false, err
		}
		if n := base + cs.buckets[k]; n != 0 {
			w.counted = append(w.counted, countDelta{provider: k.provider, state: k.state, n: -n, exp: k.sec})
		}
	}
	cs.swept = max(cs.swept, upto)
	w.set([]byte(sweptKey), binary.BigEndian.AppendUint64(nil, cs.swept), 0)
	return more, nil
}

// sweepUntil takes the records whose retention ended by the second now
// out of the counts, in deferrable operations of the committer of about
// sweepChunk buckets each.
func (b *Badger) sweepUntil(ctx context.Context, now uint64) error {
	for {
		var more bool
		err := b.submit(ctx, &op{size: 64 * sweepChunk, lazy: true, apply: func(w *batch) error {
			var err error
			more, err = w.sweep(now)
			return err
		}})
		if err != nil || !more {
			return err
		}
	}
}

// bucketDue reports whether the earliest expiry bucket's second is at or
// before now (one seek); a malformed first key is due too (the sweep
// deletes it).
func (b *Badger) bucketDue(now uint64) bool {
	due := false
	_ = b.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(bucketPrefix)})
		defer it.Close()
		it.Rewind()
		if it.Valid() {
			k, ok := parseBucketKey(it.Item().Key())
			due = !ok || k.sec <= now
		}
		return nil
	})
	return due
}

// sweepLoop sweeps every sweepEvery that a bucket is due, until the store
// stops. A sweep that fails (the disk below min_free_space, which the
// space guard reports itself, or a failed commit) is logged and tried
// again at the next tick: the records stay counted until it succeeds.
func (b *Badger) sweepLoop() {
	b.everyTick(sweepEvery, b.sweepDone, func() {
		now := uint64(time.Now().Unix())
		if !b.bucketDue(now) {
			return
		}
		err := b.sweepUntil(context.Background(), now)
		if err != nil && !errors.Is(err, store.ErrClosed) && !errors.Is(err, store.ErrUnavailable) {
			b.log.Warn("counting out expired records failed; trying again", zap.Error(err))
		}
	})
}

// checkCounts (SelfCheck, at open, before the sweep loop starts) compares
// the persisted counts with what the keys say, and panics if they
// disagree, once the buckets whose second has come (which the sweep has
// yet to take) are taken out. A check that a second boundary crossed is
// run again.
func (b *Badger) checkCounts() error {
	for {
		start := uint64(time.Now().Unix())
		var scanned *memCounts
		var due []countDelta
		if err := b.view(func(txn *badger.Txn) error {
			var err error
			if scanned, err = countKeys(&batch{txn: txn}, nil); err != nil {
				return err
			}
			var serr error
			err = (&batch{txn: txn}).scan(bucketPrefix, func(k []byte) bool {
				bk, ok := parseBucketKey(k)
				if !ok || bk.sec > start {
					return false
				}
				var n int64
				if n, serr = stored(txn, bk); serr != nil {
					return false
				}
				due = append(due, countDelta{provider: bk.provider, state: bk.state, n: -n})
				return true
			})
			return cmp.Or(err, serr)
		}); err != nil {
			return err
		}
		if uint64(time.Now().Unix()) != start {
			continue
		}
		// Plain sums: a persisted count below its due buckets must
		// show, not vanish as a count that reached 0.
		persisted := map[countSum]int64{}
		for p, states := range b.counts.snapshot().Records {
			for s, n := range states {
				persisted[countSum{p, s}] += n
			}
		}
		for _, d := range due {
			persisted[countSum{d.provider, d.state}] += d.n
		}
		keys := map[countSum]int64{}
		for p, states := range scanned.snapshot().Records {
			for s, n := range states {
				keys[countSum{p, s}] = n
			}
		}
		maps.DeleteFunc(persisted, func(_ countSum, n int64) bool { return n == 0 })
		if !maps.Equal(persisted, keys) {
			panic(fmt.Sprintf("store: persisted counts %v disagree with the keys' %v", persisted, keys))
		}
		return nil
	}
}

// readSwept reads the second the last sweep took every bucket up to, 0 if
// none was stored.
func readSwept(db badgerDB) (uint64, error) {
	var sec uint64
	err := db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte(sweptKey))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("%s of %d bytes", sweptKey, len(v))
			}
			sec = binary.BigEndian.Uint64(v)
			return nil
		})
	})
	return sec, err
}
