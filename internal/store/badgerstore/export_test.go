package badgerstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// CheckIndexes checks that the index entries of s, a *Badger, are exactly
// those its records and tasks call for, with the right TTLs: every due,
// lease and poll entry points at a state that has it (no stale entry), every
// state that needs one has it, and every expiry-watch entry watches the
// current record's expiry. It is the storetest harness's Check for Badger.
func CheckIndexes(s store.Store) error {
	b, ok := s.(*Badger)
	if !ok {
		return fmt.Errorf("CheckIndexes: %T is not a *Badger", s)
	}
	return b.view(func(txn *badger.Txn) error { return checkIndexes(txn) })
}

// eachEntry calls fn with every entry txn sees: a copy of its key and of
// its value, and its expiry (Unix seconds, 0 for none).
func eachEntry(txn *badger.Txn, fn func(k, v []byte, expiresAt uint64)) error {
	it := txn.NewIterator(badger.IteratorOptions{PrefetchValues: true})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		v, err := it.Item().ValueCopy(nil)
		if err != nil {
			return err
		}
		fn(it.Item().KeyCopy(nil), v, it.Item().ExpiresAt())
	}
	return nil
}

func checkIndexes(txn *badger.Txn) error {
	type entry struct {
		exp uint64
		val []byte
	}
	keys := map[string]entry{}
	if err := eachEntry(txn, func(k, v []byte, expiresAt uint64) { keys[string(k)] = entry{expiresAt, v} }); err != nil {
		return err
	}

	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	want := map[string]uint64{} // index entries the states call for → TTL
	for k, e := range keys {
		switch {
		case strings.HasPrefix(k, deliveryPrefix):
			key, _ := parseTail([]byte(k[len(deliveryPrefix):]))
			var d store.Delivery
			if err := decodeDelivery(e.val, &d); err != nil {
				bad("%s: %v", k, err)
				continue
			}
			r, ok := keys[string(recordKey(key))]
			if !ok {
				bad("%s: no record", k)
				continue
			}
			exp := r.exp
			wantIndexes(want, key, &d, exp)
			if d.State == store.StateDelivered && e.exp != exp {
				bad("%s: delivered, TTL %d, want the record's %d", k, e.exp, exp)
			}
			if d.State != store.StateDelivered && e.exp != graced(exp) {
				bad("%s: TTL %d, want the record's %d plus the grace", k, e.exp, exp)
			}
			if (d.State == store.StateForwarding) != (d.Lease.Owner != "") {
				bad("%s: state %s with lease %+v", k, d.State, d.Lease)
			}
			if d.State == store.StateForwarding && !d.DueAt.IsZero() {
				bad("%s: forwarding with a due time", k)
			}

		case strings.HasPrefix(k, recordPrefix):
			key, _ := parseTail([]byte(k[len(recordPrefix):]))
			var rec store.Record
			if err := decodeRecord(e.val, &rec); err != nil {
				bad("%s: %v", k, err)
				continue
			}
			want[string(receivedIndexKey(key, rec.ReceivedAt))] = e.exp
			if _, ok := keys[string(deliveryKey(key))]; !ok {
				// Not changed since the insert: the state is the record's.
				var d store.Delivery
				if err := decodeRecordDelivery(e.val, &d); err != nil {
					bad("%s: %v", k, err)
					continue
				}
				if (d.State == store.StateForwarding) != (d.Lease.Owner != "") {
					bad("%s: state %s with lease %+v", k, d.State, d.Lease)
				}
				wantIndexes(want, key, &d, e.exp)
			}
		case strings.HasPrefix(k, taskPrefix):
			var t store.Task
			if err := decodeTask(e.val, &t); err != nil {
				bad("%s: %v", k, err)
				continue
			}
			if e.exp != expiry(t.ExpiresAt) {
				bad("%s: TTL %d, want %d", k, e.exp, expiry(t.ExpiresAt))
			}
			if pk := pollKey(&t); pk != nil {
				want[string(pk)] = e.exp
			}
			want[string(taskOrderKey(&t))] = e.exp
		}
	}
	for k, e := range keys {
		switch {
		case strings.HasPrefix(k, duePrefix), strings.HasPrefix(k, fairPrefix), strings.HasPrefix(k, leasePrefix), strings.HasPrefix(k, pollPrefix), strings.HasPrefix(k, statePrefix),
			strings.HasPrefix(k, receivedPrefix), strings.HasPrefix(k, taskOrderPrefix):
			exp, ok := want[k]
			if !ok {
				bad("stale index entry %q", k)
			} else if e.exp != exp {
				bad("index entry %q: TTL %d, want %d", k, e.exp, exp)
			}
		case strings.HasPrefix(k, expiryPrefix):
			at, key, ok := parseTimeKey(expiryPrefix, []byte(k))
			r, found := keys[string(recordKey(key))]
			_, stated := keys[string(deliveryKey(key))]
			switch {
			case !ok || !found || !stated:
				bad("expiry watch %q of no record", k)
			case uint64(at.Unix()) != r.exp:
				bad("expiry watch %q at %d, but the record expires at %d", k, at.Unix(), r.exp)
			case e.exp != graced(r.exp):
				bad("expiry watch %q: TTL %d, want %d", k, e.exp, graced(r.exp))
			}
		}
	}
	for k := range want {
		if _, ok := keys[k]; !ok {
			bad("missing index entry %q", k)
		}
	}
	// The expiry buckets of the records ([bucketPrefix]), one second
	// past now and later: earlier ones may be the sweep's to take.
	buckets := map[bucketKey]int64{}
	if _, err := countKeys(&batch{txn: txn}, buckets); err != nil {
		return err
	}
	after := uint64(time.Now().Unix()) + 1
	for k, e := range keys {
		if !strings.HasPrefix(k, bucketPrefix) {
			continue
		}
		bk, ok := parseBucketKey([]byte(k))
		switch {
		case !ok || len(e.val) != 8:
			bad("expiry bucket %q = %q", k, e.val)
		case bk.sec > after && int64(binary.BigEndian.Uint64(e.val)) != buckets[bk]:
			bad("expiry bucket %q = %d, but %d records in its state expire then", k, binary.BigEndian.Uint64(e.val), buckets[bk])
		}
	}
	for bk, n := range buckets {
		if _, ok := keys[string(bk.key())]; bk.sec > after && !ok {
			bad("missing expiry bucket %q of %d records", bk.key(), n)
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "\n"))
	}
	return nil
}

// wantIndexes adds the index entries delivery state d of key calls for.
func wantIndexes(want map[string]uint64, key store.Key, d *store.Delivery, exp uint64) {
	if dk := dueIndexKey(key, d); dk != nil {
		want[string(dk)] = exp
	}
	if fk := fairIndexKey(key, d); fk != nil {
		want[string(fk)] = exp
	}
	if lk := leaseIndexKey(key, d); lk != nil {
		want[string(lk)] = exp
	}
	if d.State != store.StateDelivered && d.State != store.StateForwarding && exp > 0 {
		want[string(timeKey(expiryPrefix, time.Unix(int64(exp), 0), key))] = graced(exp)
	}
	if sk := stateIndexKey(key, d); sk != nil {
		want[string(sk)] = exp
	}
}

// cloneRecord returns a deep copy of r. Keep it in step with Record's fields: all
// but Request.Header and Request.Body are values.
func cloneRecord(r *store.Record) *store.Record {
	c := *r
	c.Request.Header = r.Request.Header.Clone()
	c.Request.Body = bytes.Clone(r.Request.Body)
	return &c
}

// crash closes b the way a crash would leave it: the committer stops, the
// journal gets no final checkpoint and Badger keeps what it was given.
func (b *Badger) crash() {
	b.once.Do(func() {
		b.stopLoops()
		b.journal.stopWorkers()
		_ = b.journal.closeFiles()
		b.closeErr = b.db.Close()
	})
}

// waitIdle waits until no checkpoint runs.
func (j *journal) waitIdle() {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.running {
		j.cond.Wait()
	}
}

// waitCheckpointed waits until a checkpoint succeeded after the last
// failure.
func (j *journal) waitCheckpointed() {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.ckptErr != nil {
		j.cond.Wait()
	}
}

// WithGatherMax returns o with ListPage gathering at most n records of a
// state (Badger.gatherCap): 0 makes every state listing walk the
// received-time index.
func WithGatherMax(o Options, n int) Options {
	o.gatherMax = &n
	return o
}
