package badgerstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// Key layout (keys sort bytewise; times are 8 big-endian bytes of Unix
// nanoseconds, so keys sort by time):
//
//	m/format                                  → format version, decimal ("2")
//	m/epoch                                   → 8-byte big-endian lease epoch of the last open
//	r/<provider>/<id>                         → JSON Record, as first stored
//	s/<provider>/<id>                         → JSON Delivery: the record's current delivery state
//	q/<DueAt><provider>/<id>                  → empty; queued and failed records by due time
//	f/<DueAt><provider>/<id>                  → empty; those of q/ with at most FewFailures failures (fair claims)
//	l/<epoch><Lease.Until><provider>/<id>     → empty; forwarding records by lease
//	x/<ExpiresAt><provider>/<id>              → empty; the expiry watch of records ever left undelivered
//	v/<state>/<provider>/<id>                 → empty; queued, failed, rejected and parked records by state (List)
//	i/<provider>/<ReceivedAt><id>             → empty; every record by received time (ListPage; [receivedPrefix])
//	g/<provider>/<id>                         → empty; the tombstone of a purged record ([purgedPrefix])
//	m/count/<provider>/<state>                → record count ([countPrefix])
//	e/<second><provider>/<state>              → count of the records in state expiring then ([bucketPrefix])
//	w/<UpdatedAt><provider>/<id>              → empty; delivered records by delivery time ([deliveredPrefix])
//
// r/, q/, f/, l/, i/ and g/ carry the record's ExpiresAt as Badger TTL, as
// does the s/ of a delivered record; the s/ of any other state and x/
// outlive it by expiryGrace so that Expire can still tell what was never
// delivered.
const (
	metaFormatKey  = "m/format"
	metaEpochKey   = "m/epoch"
	recordPrefix   = "r/"
	deliveryPrefix = "s/"
	duePrefix      = "q/"
	fairPrefix     = "f/"
	leasePrefix    = "l/"
	expiryPrefix   = "x/"
	statePrefix    = "v/"

	expiryGrace = time.Hour
)

// batch is one operation's view of the group commit's transaction: reads
// see the transaction (so every earlier operation of the batch), writes are
// buffered and reach the transaction only through flush, once the operation
// has succeeded. An operation does not read its own writes.
type batch struct {
	txn    *badger.Txn
	writes []write
	// epoch, if set, is the lease epoch whose lease changes go to leases.
	epoch  uint64
	leases []leaseEvent
	// counted are the count changes of the operation's writes, applied
	// to the store's counts once the batch is committed.
	counted []countDelta
	// aged are the changes of the ages ([Badger.Ages]), applied with
	// counted; recvKey and recvAt are the received time of the record
	// the operation read or wrote last, liveAt that of the live pingback
	// it stored (zero if none).
	aged           []ageDelta
	recvKey        store.Key
	recvAt, liveAt time.Time
	// has and fresh are the committer's shortcuts ([presence],
	// [fresh]); nil in a read-only view. added is the fresh state
	// the operation's insert wrote, if any (freshKey).
	has      *presence
	fresh    *fresh
	added    *freshState
	freshKey store.Key
	// cs is the commit's account of the persisted counts
	// (see [countState]); nil in a read-only view or an upgrade.
	cs *countState
	// selfCheck is the store's Options.SelfCheck, in the committer's
	// batch only.
	selfCheck bool
}

// reuse makes w base, keeping w's buffers (emptied; the writes' keys and
// values let go), so that the committer's one batch value serves each
// operation in turn without allocating.
func (w *batch) reuse(base batch) {
	clear(w.writes)
	base.writes, base.leases, base.counted, base.aged = w.writes[:0], w.leases[:0], w.counted[:0], w.aged[:0]
	*w = base
}

// write is one buffered write: a set, or a deletion when del is true.
type write struct {
	key, val []byte
	exp      uint64
	del      bool
}

func (w *batch) set(key, val []byte, exp uint64) {
	w.writes = append(w.writes, write{key: key, val: val, exp: exp})
}

func (w *batch) del(key []byte) {
	w.writes = append(w.writes, write{key: key, del: true})
}

// flush writes the buffered writes into the transaction, in order.
func (w *batch) flush() error {
	for _, x := range w.writes {
		var err error
		if x.del {
			err = w.txn.Delete(x.key)
		} else {
			e := badger.NewEntry(x.key, x.val)
			e.ExpiresAt = x.exp
			err = w.txn.SetEntry(e)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// scan calls fn with each key under prefix, in order, while fn returns
// true. The key is only valid during the call.
func (w *batch) scan(prefix string, fn func(k []byte) bool) error {
	return w.scanFrom(prefix, nil, fn)
}

// scanFrom is scan from the first key at or after start (nil: the
// prefix's first).
func (w *batch) scanFrom(prefix string, start []byte, fn func(k []byte) bool) error {
	it := w.txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix)})
	defer it.Close()
	if start == nil {
		start = []byte(prefix)
	}
	for it.Seek(start); it.Valid(); it.Next() {
		if !fn(it.Item().Key()) {
			break
		}
	}
	return nil
}

// get returns the item under key, or ErrNotFound.
func (w *batch) get(key []byte) (*badger.Item, error) {
	item, err := w.txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, store.ErrNotFound
	}
	return item, err
}

// recordOnly returns the record under k as first stored, without its
// current delivery state.
func (w *batch) recordOnly(k store.Key) (*store.Record, error) {
	item, err := w.get(recordKey(k))
	if err != nil {
		return nil, err
	}
	rec := new(store.Record)
	if err := item.Value(func(v []byte) error { return decodeRecord(v, rec) }); err != nil {
		return nil, fmt.Errorf("decoding record %s: %w", k, err)
	}
	return rec, nil
}

// record returns the record under k with its current delivery state.
func (w *batch) record(k store.Key) (*store.Record, error) {
	rec, err := w.recordOnly(k)
	if err != nil {
		return nil, err
	}
	return rec, w.overlayDelivery(rec)
}

// overlayDelivery sets rec's delivery state from its s/ key, the current
// one (the copy inside r/ is the state at insert).
func (w *batch) overlayDelivery(rec *store.Record) error {
	d, _, err := w.delivery(rec.Key())
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	rec.Delivery = d
	return nil
}

// delivery returns the delivery state of k and the record's expiry (Unix
// seconds), or ErrNotFound: its s/ value, or, for a record whose state has
// not changed since it was stored (the insert writes no s/), the state in
// its r/ value.
func (w *batch) delivery(k store.Key) (store.Delivery, uint64, error) {
	if w.fresh != nil {
		if d, exp, ok := w.fresh.get(k, time.Now()); ok {
			if w.selfCheck {
				w.checkFresh(k, d, exp)
			}
			return d, exp, nil
		}
	}
	var d store.Delivery
	item, err := w.get(deliveryKey(k))
	if errors.Is(err, store.ErrNotFound) {
		item, err = w.get(recordKey(k))
		if err != nil {
			return d, 0, err
		}
		if err := item.Value(func(v []byte) error { return decodeRecordDelivery(v, &d) }); err != nil {
			return d, 0, fmt.Errorf("decoding record %s: %w", k, err)
		}
		return d, item.ExpiresAt(), nil
	}
	if err != nil {
		return d, 0, err
	}
	if err := item.Value(func(v []byte) error { return decodeDelivery(v, &d) }); err != nil {
		return d, 0, fmt.Errorf("decoding delivery of %s: %w", k, err)
	}
	exp := item.ExpiresAt()
	if exp == 0 {
		return d, 0, nil
	}
	if d.State != store.StateDelivered {
		return d, exp - uint64(expiryGrace/time.Second), nil
	}
	// A delivered state expires with its record (writeDelivery); one
	// written before it did outlives the record by the grace. The
	// record's own expiry tells, while it is there; once it is gone, only
	// such an older state can still be read.
	rec, err := w.get(recordKey(k))
	if errors.Is(err, store.ErrNotFound) {
		return d, exp - uint64(expiryGrace/time.Second), nil
	}
	if err != nil {
		return d, 0, err
	}
	return d, rec.ExpiresAt(), nil
}

// writeDelivery stores the delivery state d of k (val: d already encoded,
// or nil) and moves its index entries from old's (nil for a new record).
// exp is the record's expiry, Unix seconds.
func (w *batch) writeDelivery(k store.Key, old, d *store.Delivery, exp uint64, val []byte) {
	w.moveIndexes(k, old, d, exp)
	if val == nil {
		val = encodeDelivery(d)
	}
	ttl := graced(exp)
	if d.State == store.StateDelivered {
		// Expire has nothing to report of a delivered result: its state
		// leaves with the record instead of an hour later, which at a
		// short retention would be most of what the store holds.
		ttl = exp
	}
	w.set(deliveryKey(k), val, ttl)
}

// dropDelivery deletes the delivery state of k and its index entries.
func (w *batch) dropDelivery(k store.Key, old *store.Delivery, exp uint64) {
	w.moveIndexes(k, old, &store.Delivery{State: store.StateDelivered}, exp)
	w.countRecord(k.Provider, store.StateDelivered, -1, exp)
	w.del(deliveryKey(k))
}

// moveIndexes deletes old's due and lease entries that d no longer has and
// writes d's; a record left undelivered joins the expiry watch.
func (w *batch) moveIndexes(k store.Key, old, d *store.Delivery, exp uint64) {
	if was, is := old != nil && inBacklog(old.State), inBacklog(d.State); was != is {
		w.trackBacklog(k, is)
	}
	if old == nil || old.State != d.State {
		if old != nil {
			w.countRecord(k.Provider, old.State, -1, exp)
		}
		w.countRecord(k.Provider, d.State, 1, exp)
	}
	var oldDue, oldFair, oldLease []byte
	if old != nil {
		oldDue, oldFair, oldLease = dueIndexKey(k, old), fairIndexKey(k, old), leaseIndexKey(k, old)
	}
	newDue, newFair, newLease := dueIndexKey(k, d), fairIndexKey(k, d), leaseIndexKey(k, d)
	var oldState []byte
	if old != nil {
		oldState = stateIndexKey(k, old)
	}
	newState := stateIndexKey(k, d)
	if oldState != nil && string(oldState) != string(newState) {
		w.del(oldState)
	}
	if newState != nil {
		w.set(newState, nil, exp)
	}
	if oldDue != nil && string(oldDue) != string(newDue) {
		w.del(oldDue)
	}
	if oldFair != nil && string(oldFair) != string(newFair) {
		w.del(oldFair)
	}
	if oldLease != nil && string(oldLease) != string(newLease) {
		w.del(oldLease)
		w.leaseChange(k, old, false)
	}
	if newDue != nil {
		w.set(newDue, nil, exp)
	}
	if newFair != nil {
		w.set(newFair, nil, exp)
	}
	if newLease != nil {
		w.set(newLease, nil, exp)
		w.leaseChange(k, d, true)
	}
	if d.State != store.StateDelivered && d.State != store.StateForwarding && exp > 0 {
		w.set(timeKey(expiryPrefix, time.Unix(int64(exp), 0), k), nil, graced(exp))
	}
	w.watchDelivered(k, old, d, exp)
}

// leaseChange notes that the lease of d (forwarding) starts or ends, if
// it is one of w.epoch.
func (w *batch) leaseChange(k store.Key, d *store.Delivery, start bool) {
	if w.epoch == 0 {
		return
	}
	switch epoch := ownerEpoch(d.Lease.Owner); {
	case epoch == w.epoch:
		w.leases = append(w.leases, leaseEvent{leaseAt: leaseAt{k, store.UnixNano(d.Lease.Until)}, start: start})
	case start && epoch < w.epoch:
		// A lease handed to an earlier owner (an update function may
		// name one): the claim scan must look at earlier epochs again.
		w.leases = append(w.leases, leaseEvent{older: true})
	}
}

// stateIndexKey is the v/ entry of a delivery in a state List finds by
// index (queued, failed, rejected, parked, quarantined, expired), else
// nil: the happy path (forwarding, then delivered) writes none.
func stateIndexKey(k store.Key, d *store.Delivery) []byte {
	if !indexedState(d.State) {
		return nil
	}
	return []byte(statePrefix + string(d.State) + "/" + k.Provider + "/" + k.ID)
}

func indexedState(s store.State) bool {
	return s == store.StateQueued || s == store.StateFailed || s == store.StateRejected || s == store.StateParked || s == store.StateQuarantined ||
		s == store.StateExpired
}

// dueIndexKey is the q/ entry of a queued or failed delivery, else nil.
func dueIndexKey(k store.Key, d *store.Delivery) []byte {
	if (d.State != store.StateQueued && d.State != store.StateFailed) || d.DueAt.IsZero() {
		return nil
	}
	return timeKey(duePrefix, d.DueAt, k)
}

// fairIndexKey is the f/ entry of a queued or failed delivery with at
// most FewFailures failures (the candidates of ClaimRequest.Reserved),
// else nil.
func fairIndexKey(k store.Key, d *store.Delivery) []byte {
	if (d.State != store.StateQueued && d.State != store.StateFailed) || d.DueAt.IsZero() || d.Failures > store.FewFailures {
		return nil
	}
	return timeKey(fairPrefix, d.DueAt, k)
}

// leaseIndexKey is the l/ entry of a forwarding delivery, else nil.
func leaseIndexKey(k store.Key, d *store.Delivery) []byte {
	if d.State != store.StateForwarding {
		return nil
	}
	b := make([]byte, 0, len(leasePrefix)+16+len(k.Provider)+1+len(k.ID))
	b = append(b, leasePrefix...)
	b = binary.BigEndian.AppendUint64(b, ownerEpoch(d.Lease.Owner))
	b = binary.BigEndian.AppendUint64(b, store.UnixNano(d.Lease.Until))
	return append(b, k.Provider+"/"+k.ID...)
}

// parseLeaseKey splits an l/ key.
func parseLeaseKey(k []byte) (epoch uint64, until time.Time, key store.Key, ok bool) {
	n := len(leasePrefix)
	if len(k) < n+16 {
		return 0, time.Time{}, store.Key{}, false
	}
	epoch = binary.BigEndian.Uint64(k[n:])
	until = time.Unix(0, int64(binary.BigEndian.Uint64(k[n+8:]))).UTC()
	key, ok = parseTail(k[n+16:])
	return epoch, until, key, ok
}

// timeKey is prefix, at, then "<provider>/<id>".
func timeKey(prefix string, at time.Time, k store.Key) []byte {
	b := make([]byte, 0, len(prefix)+8+len(k.Provider)+1+len(k.ID))
	b = append(b, prefix...)
	b = binary.BigEndian.AppendUint64(b, store.UnixNano(at))
	return append(b, k.Provider+"/"+k.ID...)
}

// parseTimeKey splits a key made by timeKey.
func parseTimeKey(prefix string, k []byte) (time.Time, store.Key, bool) {
	if len(k) < len(prefix)+8 {
		return time.Time{}, store.Key{}, false
	}
	at := time.Unix(0, int64(binary.BigEndian.Uint64(k[len(prefix):]))).UTC()
	key, ok := parseTail(k[len(prefix)+8:])
	return at, key, ok
}

// parseTail splits "<provider>/<id>".
func parseTail(tail []byte) (store.Key, bool) {
	p, id, ok := strings.Cut(string(tail), "/")
	return store.Key{Provider: p, ID: id}, ok
}

func recordKey(k store.Key) []byte   { return []byte(recordPrefix + k.Provider + "/" + k.ID) }
func deliveryKey(k store.Key) []byte { return []byte(deliveryPrefix + k.Provider + "/" + k.ID) }

// expiry is a record's ExpiresAt as Badger TTL (Unix seconds).
//
// Badger reads 0 as "never expires", so a time at or before the Unix epoch
// (which would give 0, or wrap around to a huge value as a negative number
// turned unsigned) is clamped to 1: expired at once, never immortal. The
// zero time is the only "no TTL".
func expiry(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	if s := t.Unix(); s > 0 {
		return uint64(s)
	}
	return 1
}

// graced is exp plus expiryGrace (0 stays 0: no TTL).
func graced(exp uint64) uint64 {
	if exp == 0 {
		return 0
	}
	return exp + uint64(expiryGrace/time.Second)
}

// ownerName is the lease owner name of a Badger epoch.
func ownerName(epoch uint64) string { return "badger:" + strconv.FormatUint(epoch, 10) }

// ownerEpoch is the epoch in a Badger owner name, 0 (older than any open)
// for anything else.
func ownerEpoch(owner string) uint64 {
	s, ok := strings.CutPrefix(owner, "badger:")
	if !ok {
		return 0
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}
