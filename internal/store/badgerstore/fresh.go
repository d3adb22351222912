package badgerstore

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// fresh holds, for every live forward this handle stored and whose
// delivery state has not changed since, that state and the record's expiry:
// exactly what batch.delivery would read from Badger (no s/ key, the state
// inside r/). The forward's outcome then reads nothing from Badger: a
// lookup of the s/ key that is not there (every level of the LSM) and of
// the record (decoded) are the larger part of the outcome's cost in the
// serial committer.
//
// Invariant: an entry exists only while Badger holds no s/ key for it and
// its r/ is the one the entry was made from. Kept by the committer, which
// alone writes: an insert adds its entry once its writes reached the
// transaction (an insert of a live forward also deletes, blind, any s/
// an earlier record under the key left: s/ outlives its r/); every write
// or deletion of an r/ or s/ key (whatever the operation) drops the key's
// entry, in the order of the batch's operations;
// a failed commit clears every entry (its writes are not in Badger), as does
// a dropped transaction in tests. The map only spares reads: when empty,
// batch.delivery reads Badger as before. With SelfCheck on (tests), every
// answer it gives is compared with Badger's.
type fresh struct {
	m map[store.Key]freshState
}

type freshState struct {
	d   store.Delivery
	exp uint64 // Unix seconds, 0: no TTL
}

func newFresh() *fresh { return &fresh{m: map[store.Key]freshState{}} }

// add notes the state a live forward's insert wrote into r/: d as
// decoded from the encoded record, so that it equals what a read gives.
func (f *fresh) add(k store.Key, d store.Delivery, exp uint64) {
	f.m[k] = freshState{d: d, exp: exp}
}

// forget drops the entries of the keys whose r/ or s/ writes touches.
func (f *fresh) forget(writes []write) {
	if len(f.m) == 0 {
		return
	}
	for _, x := range writes {
		if len(x.key) < 2 || x.key[1] != '/' || (x.key[0] != recordPrefix[0] && x.key[0] != deliveryPrefix[0]) {
			continue
		}
		if k, ok := parseTail(x.key[2:]); ok {
			delete(f.m, k)
		}
	}
}

// clear drops every entry.
func (f *fresh) clear() { clear(f.m) }

// get returns k's state, if known and not past its expiry (Badger's
// test: an entry expires at ExpiresAt <= now, in Unix seconds).
func (f *fresh) get(k store.Key, now time.Time) (store.Delivery, uint64, bool) {
	s, ok := f.m[k]
	if !ok {
		return store.Delivery{}, 0, false
	}
	if s.exp != 0 && s.exp <= uint64(now.Unix()) {
		// Badger no longer returns the record: neither does the map,
		// which forgets it (a forward never answered before its
		// retention ended).
		delete(f.m, k)
		return store.Delivery{}, 0, false
	}
	d := s.d
	// The caller may append to the history (Delivery.StartAttempt and
	// EndAttempt copy before they write, but a caller's own append
	// would not): clipped, an append always copies, never writing into
	// the entry's array.
	d.History = slices.Clip(d.History)
	return d, s.exp, true
}

// checkFresh compares a fresh answer with Badger's.
func (w *batch) checkFresh(k store.Key, d store.Delivery, exp uint64) {
	has := w.fresh
	w.fresh = nil
	defer func() { w.fresh = has }()
	bd, bexp, err := w.delivery(k)
	if errors.Is(err, store.ErrNotFound) && exp != 0 && exp <= uint64(time.Now().Unix()) {
		return // the record's TTL ran out between the two reads
	}
	if err != nil || bexp != exp || !reflect.DeepEqual(bd, d) {
		panic(fmt.Sprintf("store: in-memory delivery state of %s differs from Badger's: %+v (exp %d) against %+v (exp %d, %v)", k, d, exp, bd, bexp, err))
	}
}
