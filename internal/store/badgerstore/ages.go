package badgerstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// Ages implements Counter. Badger keeps them in memory: the backlog by
// key and received time, pending tasks by submission second, moved by
// every committed batch (like the counts) and rebuilt from the indexes
// when the store opens (countAges); the last live pingback of each
// provider is also kept under m/live/<provider>, written once per group
// commit that stored one, so that it survives restarts without a scan.
// The oldest times are kept to the second, rounded up (ageSecond): an age
// told from them is under the true one by less than a second. Like the
// counts, a pending task that leaves Badger by its TTL stays counted until
// the next open.
func (b *Badger) Ages(ctx context.Context) (store.Ages, error) {
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return store.Ages{}, store.ErrClosed
	}
	return b.ages.snapshot(), nil
}

// ageSecond is the second t is aged from: the next whole second (an age
// told from it is under the true one by less than a second, never over).
func ageSecond(t time.Time) int64 {
	if t.Nanosecond() > 0 {
		return t.Unix() + 1
	}
	return t.Unix()
}

// lastLivePrefix keys the received time (8 bytes, big-endian Unix ns) of
// each provider's newest live pingback.
const lastLivePrefix = "m/live/"

// noteReceived tells the batch the received time of the record under k,
// read or written by the operation, for the backlog's tracking.
func (w *batch) noteReceived(k store.Key, at time.Time) { w.recvKey, w.recvAt = k, at }

// trackBacklog notes that the record under k enters (or leaves) the
// backlog (state failed or forwarding).
func (w *batch) trackBacklog(k store.Key, enter bool) {
	if !enter {
		w.aged = append(w.aged, ageDelta{kind: ageBacklog, key: k, n: -1})
		return
	}
	at := w.recvAt
	if w.recvKey != k || at.IsZero() {
		var err error
		if at, err = w.receivedAt(k); err != nil {
			return // the record is gone: nothing to age
		}
	}
	if at.IsZero() {
		return
	}
	w.aged = append(w.aged, ageDelta{kind: ageBacklog, key: k, sec: ageSecond(at), n: 1})
}

// trackPending notes a task entering (n 1) or leaving (n -1) TaskPending.
func (w *batch) trackPending(t *store.Task, n int64) {
	if t.SubmittedAt.IsZero() {
		return // no age to tell
	}
	w.aged = append(w.aged, ageDelta{kind: agePending, key: t.Key(), sec: ageSecond(t.SubmittedAt), n: n})
}

// receivedAt reads the received time of the record under k from its r/
// value, decoding nothing else.
func (w *batch) receivedAt(k store.Key) (time.Time, error) {
	item, err := w.get(recordKey(k))
	if err != nil {
		return time.Time{}, err
	}
	var at time.Time
	err = item.Value(func(v []byte) error {
		var err error
		_, at, err = sourceReceived(v)
		return err
	})
	return at, err
}

// sourceReceived decodes only the source and received time of an r/
// value.
func sourceReceived(v []byte) (store.Source, time.Time, error) {
	if len(v) == 0 || v[0] != tagRecord1 {
		var r store.Record
		if err := decodeRecord(v, &r); err != nil {
			return "", time.Time{}, err
		}
		return r.Source, r.ReceivedAt, nil
	}
	d := dec{b: v[1:]}
	var x store.Delivery
	deliveryLayout(decFields{&d}, &x)
	for range 3 { // provider id code
		d.raw()
	}
	src := store.Source(d.raw())
	at := d.time()
	return src, at, d.err
}

// lastLiveSeeded marks a store whose m/live/ keys were seeded from its
// records (seedLastLive), or that had them from the start.
const lastLiveSeeded = "m/live-seeded"

// seedLastLive gives a store written before the m/live/ keys existed its
// newest live pingback of each provider, once: a scan of the records
// (their source and received time only) when the store is first opened
// by this version, so that last_callback_timestamp_seconds survives that
// restart too. Its writes become durable with the checkpoint that follows
// at open (if they are lost, the next open seeds again).
func seedLastLive(db badgerDB) error {
	seeded := false
	if err := db.View(func(txn *badger.Txn) error {
		_, err := txn.Get([]byte(lastLiveSeeded))
		if err == nil {
			seeded = true
			return nil
		}
		if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		return (&batch{txn: txn}).scan(lastLivePrefix, func([]byte) bool { seeded = true; return false })
	}); err != nil || seeded {
		return err
	}
	live := map[string]time.Time{}
	if err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(recordPrefix), PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			key, ok := parseTail(it.Item().Key()[len(recordPrefix):])
			if !ok {
				continue
			}
			if err := it.Item().Value(func(v []byte) error {
				src, at, err := sourceReceived(v)
				if err == nil && src == store.SourceCallback && at.After(live[key.Provider]) {
					live[key.Provider] = at
				}
				return err
			}); err != nil {
				return fmt.Errorf("decoding record %s: %w", key, err)
			}
		}
		return nil
	}); err != nil {
		return err
	}
	return db.Update(func(txn *badger.Txn) error {
		for _, w := range liveWrites(live) {
			if err := txn.Set(w.key, w.val); err != nil {
				return err
			}
		}
		return txn.Set([]byte(lastLiveSeeded), nil)
	})
}

// countAges rebuilds the ages when the store opens: the backlog from the
// failed state index and the lease index (each record's received time
// read), pending tasks from the pending runs of the task order (each
// task's submission time read), the last live pingbacks from m/live/.
func countAges(w *batch) (*memAges, error) {
	a := newMemAges()
	var ds []ageDelta
	var keys []store.Key
	var tasks []store.Key
	live := map[string]time.Time{}
	steps := []struct {
		prefix string
		fn     func(k []byte)
	}{
		{statePrefix + string(store.StateFailed) + "/", func(k []byte) {
			if key, ok := parseTail(k[len(statePrefix)+len(store.StateFailed)+1:]); ok {
				keys = append(keys, key)
			}
		}},
		{leasePrefix, func(k []byte) {
			if _, _, key, ok := parseLeaseKey(k); ok {
				keys = append(keys, key)
			}
		}},
		{pendingOrderPrefix, func(k []byte) {
			if provider, _, _, id, ok := splitAccountTimeKey(k[len(pendingOrderPrefix):]); ok {
				tasks = append(tasks, store.Key{Provider: provider, ID: id})
			}
		}},
	}
	for _, s := range steps {
		if err := w.scan(s.prefix, func(k []byte) bool { s.fn(k); return true }); err != nil {
			return nil, err
		}
	}
	for _, k := range keys {
		d, _, err := w.delivery(k)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if !inBacklog(d.State) {
			continue // a stale index entry
		}
		at, err := w.receivedAt(k)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading record %s: %w", k, err)
		}
		if at.IsZero() {
			continue
		}
		ds = append(ds, ageDelta{kind: ageBacklog, key: k, sec: ageSecond(at), n: 1})
	}
	for _, k := range tasks {
		t, err := w.task(k)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if t.State == store.TaskPending && !t.SubmittedAt.IsZero() {
			ds = append(ds, ageDelta{kind: agePending, key: k, sec: ageSecond(t.SubmittedAt), n: 1})
		}
	}
	err := w.scan(lastLivePrefix, func(k []byte) bool {
		item, err := w.get(k)
		if err != nil {
			return true
		}
		_ = item.Value(func(v []byte) error {
			if len(v) == 8 {
				live[strings.TrimPrefix(string(k), lastLivePrefix)] = time.Unix(0, int64(binary.BigEndian.Uint64(v))).UTC()
			}
			return nil
		})
		return true
	})
	if err != nil {
		return nil, err
	}
	a.apply(ds, live)
	return a, nil
}

// liveWrites are the m/live/ writes of a batch whose inserts stored live
// pingbacks received at live (provider → newest).
func liveWrites(live map[string]time.Time) []write {
	out := make([]write, 0, len(live))
	for p, t := range live {
		out = append(out, write{key: []byte(lastLivePrefix + p), val: binary.BigEndian.AppendUint64(nil, store.UnixNano(t))})
	}
	return out
}
