package badgerstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
	"go.uber.org/zap"
)

// formatVersion is the stored format this code writes. History:
//
//	1 (no m/format key): delivery states without failures or leases; a
//	  forwarding record sat in q/ at the time it would count as stuck.
//	2: failures and interrupts counted apart from attempts, leases in l/
//	  by owner epoch, queued state, expiry watch x/, s/ outliving r/.
//	3: the journal ([journal]) in front of Badger, which code of
//	  format 2 would ignore; values of r/, s/ and t/ written in the binary
//	  encoding of [encodeRecord], [encodeDelivery] and [encodeTask] (JSON
//	  values of format 2 stay readable, so a store of format 2 needs no
//	  rewrite).
//	4: the received-time index i/ ([receivedPrefix]) and the tombstones g/
//	  of purged records ([purgedPrefix]); opening a store of an earlier
//	  format writes the i/ entries of its records.
//	5: the task order index o/ ([taskOrderPrefix]), by state, provider
//	  and submission time; opening a store of an earlier format writes
//	  the o/ entries of its tasks.
//	6: the fair claims index f/ ([fairPrefix]), the due records of q/
//	  with at most FewFailures failures; opening a store of an earlier
//	  format writes the f/ entries of its due records.
//	7: tasks have accounts (Task.Account, appended to the t/ value); the
//	  poll index p/ and the task order o/ are keyed by account (runs per
//	  provider and account: [pollRunPrefix], [taskOrderRun]). Opening a
//	  store of an earlier format stamps its tasks with
//	  Options.LegacyAccounts and rewrites every p/ and o/ entry in the
//	  new layout (upgradeTaskIndexes; it also writes the o/ entries
//	  formats 1 to 4 lacked).
//	8: the record counts are persisted (m/count/, [countPrefix]) and
//	  records are counted by expiry second and state (e/,
//	  [bucketPrefix]), so that an open reads the counts instead of
//	  every record key. Opening a store of an earlier format counts its
//	  record keys once and writes both (persistCounts).
const formatVersion = 8

// openFormat brings the database to formatVersion and takes the next lease
// epoch, durably, before the store serves anything. It returns the epoch.
// legacy is Options.LegacyAccounts, given to the tasks of a store
// of format 6 or earlier.
func openFormat(db badgerDB, log *zap.Logger, legacy map[string]string) (uint64, error) {
	version, err := checkFormat(db)
	if err != nil {
		return 0, err
	}
	switch {
	case version == 1:
		n, err := migrateFormat1(db)
		if err != nil {
			return 0, fmt.Errorf("upgrading stored format 1 to %d: %w", formatVersion, err)
		}
		log.Info("upgraded the stored format", zap.Int("from", 1), zap.Int("to", formatVersion), zap.Int("records", n))
	case version == 2:
		n, err := buildStateIndex(db)
		if err != nil {
			return 0, fmt.Errorf("upgrading stored format 2 to %d: %w", formatVersion, err)
		}
		log.Info("upgraded the stored format", zap.Int("from", 2), zap.Int("to", formatVersion), zap.Int("indexed", n))
	}
	if version >= 1 && version < 4 {
		n, err := buildReceivedIndex(db)
		if err != nil {
			return 0, fmt.Errorf("upgrading stored format %d to %d: %w", version, formatVersion, err)
		}
		log.Info("built the received-time index", zap.Int("from", version), zap.Int("to", formatVersion), zap.Int("records", n))
	}
	if version >= 1 && version < 6 {
		n, err := buildFairIndex(db)
		if err != nil {
			return 0, fmt.Errorf("upgrading stored format %d to %d: %w", version, formatVersion, err)
		}
		log.Info("built the fair claims index", zap.Int("from", version), zap.Int("to", formatVersion), zap.Int("records", n))
	}
	if version >= 1 && version < 7 {
		n, stamped, err := upgradeTaskIndexes(db, legacy)
		if err != nil {
			return 0, fmt.Errorf("upgrading stored format %d to %d: %w", version, formatVersion, err)
		}
		log.Info("rewrote the task indexes by account", zap.Int("from", version), zap.Int("to", formatVersion),
			zap.Int("tasks", n), zap.Int("stamped", stamped))
	}
	if version >= 1 && version < 8 {
		n, err := persistCounts(db)
		if err != nil {
			return 0, fmt.Errorf("upgrading stored format %d to %d: %w", version, formatVersion, err)
		}
		log.Info("persisted the record counts", zap.Int("from", version), zap.Int("to", formatVersion), zap.Int64("records", n))
	}
	var epoch uint64
	err = db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte(metaEpochKey))
		switch {
		case errors.Is(err, badger.ErrKeyNotFound):
		case err != nil:
			return err
		default:
			if err := item.Value(func(v []byte) error {
				if len(v) != 8 {
					return fmt.Errorf("lease epoch of %d bytes", len(v))
				}
				epoch = binary.BigEndian.Uint64(v)
				return nil
			}); err != nil {
				return err
			}
		}
		epoch++
		if err := txn.Set([]byte(metaEpochKey), binary.BigEndian.AppendUint64(nil, epoch)); err != nil {
			return err
		}
		return txn.Set([]byte(metaFormatKey), []byte(strconv.Itoa(formatVersion)))
	})
	return epoch, err
}

// checkFormat returns the stored format, or an error if this code cannot
// open it.
func checkFormat(db badgerDB) (int, error) {
	version, err := storedFormat(db)
	if err == nil && version > formatVersion {
		err = fmt.Errorf("stored format %d is newer than this plugin's (%d): upgrade the plugin", version, formatVersion)
	}
	return version, err
}

// storedFormat reads m/format: 0 for an empty database, 1 for a database
// with records but no format key.
func storedFormat(db badgerDB) (int, error) {
	version := 0
	err := db.View(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte(metaFormatKey))
		if err == nil {
			return item.Value(func(v []byte) error {
				n, err := strconv.Atoi(string(v))
				if err != nil {
					return fmt.Errorf("format key %q: %w", v, err)
				}
				version = n
				return nil
			})
		}
		if !errors.Is(err, badger.ErrKeyNotFound) {
			return err
		}
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		if it.Rewind(); it.Valid() {
			version = 1
		}
		return nil
	})
	return version, err
}

// buildStateIndex writes the v/ entries of a store of format 2, which had
// none: one per record in a state List finds by index. Running it again is
// harmless.
func buildStateIndex(db badgerDB) (int, error) {
	var keys [][]byte
	var exps []uint64
	err := db.View(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(deliveryPrefix)})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			k, ok := parseTail(it.Item().Key()[len(deliveryPrefix):])
			if !ok {
				continue
			}
			d, exp, err := w.delivery(k)
			if err != nil {
				return err
			}
			if sk := stateIndexKey(k, &d); sk != nil {
				keys, exps = append(keys, sk), append(exps, exp)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(keys), inChunks(db, len(keys), 1000, func(w *batch, i int) { w.set(keys[i], nil, exps[i]) })
}

// buildReceivedIndex writes the i/ entry of every record, with the
// record's TTL (stores of format 3 and earlier had none). Running it again
// is harmless.
func buildReceivedIndex(db badgerDB) (int, error) {
	var keys [][]byte
	var exps []uint64
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(recordPrefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			k, ok := parseTail(item.Key()[len(recordPrefix):])
			if !ok {
				continue
			}
			var rec store.Record
			if err := item.Value(func(v []byte) error { return decodeRecord(v, &rec) }); err != nil {
				return fmt.Errorf("decoding record %s: %w", k, err)
			}
			keys, exps = append(keys, receivedIndexKey(k, rec.ReceivedAt)), append(exps, item.ExpiresAt())
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(keys), inChunks(db, len(keys), 1000, func(w *batch, i int) { w.set(keys[i], nil, exps[i]) })
}

// buildFairIndex writes the f/ entry of every due record (q/) with at
// most FewFailures failures, with the q/ entry's TTL (stores of format 5
// and earlier had none). Running it again is harmless.
func buildFairIndex(db badgerDB) (int, error) {
	var keys [][]byte
	var exps []uint64
	err := db.View(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		type entry struct {
			key store.Key
			exp uint64
		}
		var due []entry
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(duePrefix)})
		for it.Rewind(); it.Valid(); it.Next() {
			if _, k, ok := parseTimeKey(duePrefix, it.Item().Key()); ok {
				due = append(due, entry{k, it.Item().ExpiresAt()})
			}
		}
		it.Close()
		for _, e := range due {
			d, _, err := w.delivery(e.key)
			if errors.Is(err, store.ErrNotFound) {
				continue // expired; its q/ entry expires too
			}
			if err != nil {
				return err
			}
			if fk := fairIndexKey(e.key, &d); fk != nil {
				keys, exps = append(keys, fk), append(exps, e.exp)
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return len(keys), inChunks(db, len(keys), 1000, func(w *batch, i int) { w.set(keys[i], nil, exps[i]) })
}

// upgradeTaskIndexes brings the tasks of a store of format 6 or earlier
// to format 7: a task without account whose provider legacy names gets
// that account (its t/ value rewritten, TTL kept), and every p/ and o/
// key goes, replaced by the entries the tasks call for in format 7's
// layout, with the tasks' TTLs. It returns how many tasks there are and
// how many it stamped. Each batch of 500 is its own transaction, the old
// keys all gone before a new one is written; running it again is harmless
// (stamped tasks stay stamped, the indexes are rebuilt from the tasks).
func upgradeTaskIndexes(db badgerDB, legacy map[string]string) (tasks, stamped int, err error) {
	// Streamed a chunk at a time (each written while the read snapshot
	// goes on), so that a store with millions of tasks is upgraded in
	// the memory of one chunk.
	const chunk = 500
	for _, prefix := range []string{pollPrefix, taskOrderPrefix} {
		var keys [][]byte
		err = db.View(func(txn *badger.Txn) error {
			it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix)})
			defer it.Close()
			for it.Rewind(); it.Valid(); it.Next() {
				if keys = append(keys, it.Item().KeyCopy(nil)); len(keys) == chunk {
					if err := inChunks(db, len(keys), chunk, func(w *batch, i int) { w.del(keys[i]) }); err != nil {
						return err
					}
					keys = keys[:0]
				}
			}
			return inChunks(db, len(keys), chunk, func(w *batch, i int) { w.del(keys[i]) })
		})
		if err != nil {
			return 0, 0, err
		}
	}
	type entry struct {
		t   store.Task
		exp uint64
		val []byte // the stamped task's new value; nil if not stamped
	}
	var batchOf []entry
	write := func() error {
		err := inChunks(db, len(batchOf), chunk, func(w *batch, i int) {
			e := &batchOf[i]
			if e.val != nil {
				w.set(taskKey(e.t.Key()), e.val, e.exp)
			}
			if pk := pollKey(&e.t); pk != nil {
				w.set(pk, nil, e.exp)
			}
			w.set(taskOrderKey(&e.t), nil, e.exp)
		})
		batchOf = batchOf[:0]
		return err
	}
	err = db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(taskPrefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			var e entry
			if err := item.Value(func(v []byte) error { return decodeTask(v, &e.t) }); err != nil {
				return fmt.Errorf("decoding task %s: %w", item.Key(), err)
			}
			e.exp = item.ExpiresAt()
			if id := legacy[e.t.Provider]; e.t.Account == "" && id != "" {
				e.t.Account = id
				if err := store.CheckAccount(&e.t); err != nil {
					return err
				}
				v, err := encodeTask(&e.t)
				if err != nil {
					return fmt.Errorf("encoding task %s: %w", e.t.Key(), err)
				}
				e.val = v
				stamped++
			}
			tasks++
			if batchOf = append(batchOf, e); len(batchOf) == chunk {
				if err := write(); err != nil {
					return err
				}
			}
		}
		return write()
	})
	if err != nil {
		return 0, 0, err
	}
	return tasks, stamped, nil
}

// inChunks calls fn for 0..n-1, chunk calls per transaction, and writes
// what they buffered in w.
func inChunks(db badgerDB, n, chunk int, fn func(w *batch, i int)) error {
	for start := 0; start < n; start += chunk {
		err := db.Update(func(txn *badger.Txn) error {
			w := &batch{txn: txn}
			for i := start; i < min(start+chunk, n); i++ {
				fn(w, i)
			}
			return w.flush()
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// migrateFormat1 rewrites every delivery state of format 1: failures are
// taken to be the attempts of records that failed or were parked (every
// ended attempt of theirs failed), and a forwarding record, whose forward
// was cut by the stop that preceded this open, moves from q/ to a lapsed
// lease (epoch 0) so that the first claim recovers it. Each batch of
// records is rewritten in one transaction; running it again is harmless.
func migrateFormat1(db badgerDB) (int, error) {
	type entry struct {
		key store.Key
		d   store.Delivery
		exp uint64
	}
	var all []entry
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(deliveryPrefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			k, ok := parseTail(item.Key()[len(deliveryPrefix):])
			if !ok {
				continue
			}
			var d store.Delivery
			if err := item.Value(func(v []byte) error { return decodeDelivery(v, &d) }); err != nil {
				return fmt.Errorf("decoding delivery of %s: %w", k, err)
			}
			// The record's expiry is its r/ key's: s/ had the same in
			// format 1, but one this upgrade already rewrote (if it is
			// run again) carries the grace on top.
			rec, err := txn.Get(recordKey(k))
			if errors.Is(err, badger.ErrKeyNotFound) {
				continue // expired; what is left of it expires too
			}
			if err != nil {
				return err
			}
			all = append(all, entry{k, d, rec.ExpiresAt()})
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	err = inChunks(db, len(all), 500, func(w *batch, i int) {
		e := all[i]
		old, cur := e.d, e.d
		switch cur.State {
		case store.StateFailed, store.StateParked:
			if cur.Failures == 0 {
				cur.Failures = cur.Attempts
			}
		case store.StateForwarding:
			// Format 1 kept it in q/ at its stuck time; format 2
			// keeps it in l/ under the lapsed epoch 0, with the
			// stuck time as the lease's end.
			if cur.Lease.Owner != "" {
				break // rewritten by an earlier run
			}
			if !old.DueAt.IsZero() {
				w.del(timeKey(duePrefix, old.DueAt, e.key))
			}
			cur.DueAt, cur.Lease = time.Time{}, store.Lease{Owner: ownerName(0), Until: old.DueAt}
		}
		w.writeDelivery(e.key, &old, &cur, e.exp, nil)
	})
	if err != nil {
		return 0, err
	}
	return len(all), nil
}
