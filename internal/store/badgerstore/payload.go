package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// deliveredPrefix is the delivered watch: w/<UpdatedAt><provider>/<id>,
// empty, with the record's TTL, written when a record becomes delivered
// (UpdatedAt is then its delivery time), so that ErasePayloads walks the
// records due for erasure in delivery order from the first, and never
// the rest of the store. An entry whose record moved on (delivered again
// later, replayed, purged, expired or already erased) is dropped, or
// moved to the record's delivery time, when the walk reaches it.
const deliveredPrefix = "w/"

// eraseStaleFactor bounds the entries one ErasePayloads settles to this
// many times its limit (those of records that moved on included).
const eraseStaleFactor = 4

// watchDelivered writes the delivered watch of a delivery d that becomes
// delivered (old, nil for a new record, was not). The delivery a purge or
// an expiry leaves behind (dropDelivery: no time) writes nothing.
func (w *batch) watchDelivered(k store.Key, old, d *store.Delivery, exp uint64) {
	if d.State != store.StateDelivered || d.UpdatedAt.IsZero() || (old != nil && old.State == store.StateDelivered) {
		return
	}
	w.set(timeKey(deliveredPrefix, d.UpdatedAt, k), nil, exp)
}

// ErasePayloads implements PayloadEraser: one group commit walks the
// delivered watch (w/) up to before and rewrites the r/ value of each
// record due, erased (store.ErasePayload); its s/ state and indexes stay.
// No flatten, no scrub: the erased bytes leave the files as Badger
// compacts its tree and the journal is checkpointed.
func (b *Badger) ErasePayloads(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit < 1 {
		return 0, errors.New("erase payloads: need a positive limit")
	}
	n := 0
	// Entries whose record moved on (purged, replayed, delivered again)
	// are settled on the way without counting: the walk goes on past
	// them, up to staleMax entries, so that a batch short of limit means
	// that nothing more is due (the caller stops there).
	staleMax := eraseStaleFactor * limit
	o := &op{size: 512*limit + 64*staleMax, apply: func(w *batch) error {
		n = 0
		settled := 0
		var start []byte
		// A record delivered twice may have two entries here: the
		// operation does not read its own writes, so it is erased once.
		seen := make(map[store.Key]bool)
		for n < limit && settled < staleMax {
			var keys [][]byte
			err := w.scanFrom(deliveredPrefix, start, func(k []byte) bool {
				at, _, ok := parseTimeKey(deliveredPrefix, k)
				if ok && at.After(before) {
					return false
				}
				keys = append(keys, append([]byte(nil), k...))
				return len(keys) < limit-n
			})
			if err != nil {
				return err
			}
			if len(keys) == 0 {
				return nil
			}
			for _, wk := range keys {
				erased, err := w.erasePayload(wk, before, seen)
				if err != nil {
					return err
				}
				if erased {
					n++
				}
			}
			settled += len(keys)
			start = append(keys[len(keys)-1], 0) // the next key after the last
		}
		return nil
	}}
	if err := b.submit(ctx, o); err != nil {
		return 0, err
	}
	return n, nil
}

// erasePayload settles the delivered watch entry wk: it erases the
// payload of its record if the record is delivered at or before before,
// and drops the entry, or moves it to the record's later delivery time.
// seen holds the keys the operation settled already.
func (w *batch) erasePayload(wk []byte, before time.Time, seen map[store.Key]bool) (bool, error) {
	w.del(wk)
	_, key, ok := parseTimeKey(deliveredPrefix, wk)
	if !ok || seen[key] {
		return false, nil
	}
	seen[key] = true
	rec, err := w.record(key)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil // purged or expired
	}
	if err != nil {
		return false, err
	}
	exp := expiry(rec.ExpiresAt)
	switch {
	case rec.PayloadErased || rec.State != store.StateDelivered:
		// Erased, or replayed since: a delivery again writes a watch.
		return false, nil
	case rec.UpdatedAt.After(before):
		// Delivered again later: watched from then on.
		w.set(timeKey(deliveredPrefix, rec.UpdatedAt, key), nil, exp)
		return false, nil
	}
	store.ErasePayload(rec)
	val, err := encodeRecord(rec)
	if err != nil {
		return false, fmt.Errorf("encoding record: %w", err)
	}
	w.set(recordKey(key), val, exp)
	return true, nil
}

var _ store.PayloadEraser = (*Badger)(nil)
