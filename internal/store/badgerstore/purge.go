package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Purge on Badger (format 4):
//
//	g/<provider>/<id> → empty, with the record's TTL: the tombstone
//
// The record's keys (r/, s/, i/ and its index entries) and its task are
// deleted in group commits of purgeChunk keys, each writing the
// tombstones. Then the bytes leave the files (scrub): Badger's memtables
// are flushed and level 0 compacted (DropPrefix of a scratch key, run in
// the committer so that no commit meets Badger's blocked writes), the
// journal is checkpointed and both its files zeroed, and the LSM tree is
// flattened, so that every deleted version meets its deletion in a
// compaction and is dropped. When Purge returns, no file of the store's
// directory holds a purged record's bytes (a read transaction that was
// open meanwhile may keep a replaced table file until it ends).
const (
	purgedPrefix = "g/"
	// scrubKey is the scratch key whose DropPrefix flushes the memtables.
	scrubKey = "z/scrub"
)

func purgedKey(k store.Key) []byte { return []byte(purgedPrefix + k.Provider + "/" + k.ID) }

// Purge implements Purger.
func (b *Badger) Purge(ctx context.Context, q store.PurgeQuery) (int, error) {
	n, err := store.PurgeBy(ctx, b, q, func(keys []store.Key, state store.State) (int, error) { return b.purgeKeys(ctx, keys, state) })
	if err != nil || n == 0 {
		return n, err
	}
	if err := b.scrub(ctx); err != nil {
		return n, fmt.Errorf("purged %d records, but erasing their bytes from the files failed: %w", n, err)
	}
	return n, nil
}

// purgeKeys purges the records under keys (only those in state, if set)
// in one group commit, and returns how many it purged.
func (b *Badger) purgeKeys(ctx context.Context, keys []store.Key, state store.State) (int, error) {
	n := 0
	o := &op{size: 512 * len(keys), apply: func(w *batch) error {
		n = 0
		for _, k := range keys {
			ok, err := w.purge(k, state)
			if err != nil {
				return err
			}
			if ok {
				n++
			}
		}
		return nil
	}}
	if err := b.submit(ctx, o); err != nil {
		return 0, err
	}
	return n, nil
}

// purge deletes the record under k (if it is in state, when set), its
// index entries and its task, and writes its tombstone. It reports whether
// there was a record to purge.
func (w *batch) purge(k store.Key, state store.State) (bool, error) {
	rec, err := w.record(k)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if state != "" && rec.State != state {
		return false, nil
	}
	d, exp, err := w.delivery(k)
	if err != nil {
		return false, err
	}
	w.dropDelivery(k, &d, exp)
	if exp > 0 {
		w.del(timeKey(expiryPrefix, time.Unix(int64(exp), 0), k))
	}
	w.del(receivedIndexKey(k, rec.ReceivedAt))
	w.del(recordKey(k))
	switch t, err := w.task(k); {
	case err == nil:
		if t.State == store.TaskPending {
			w.counted = append(w.counted, countDelta{provider: k.Provider, account: t.Account, task: true, n: -1})
			w.trackPending(t, -1)
		}
		if pk := pollKey(t); pk != nil {
			w.del(pk)
		}
		w.del(taskOrderKey(t))
		w.del(taskKey(k))
	case !errors.Is(err, store.ErrNotFound):
		return false, err
	}
	w.set(purgedKey(k), nil, exp)
	return true, nil
}

// scrub removes the bytes of deleted keys from the store's files (see the
// comment at the top of this file). One runs at a time.
func (b *Badger) scrub(ctx context.Context) error {
	b.scrubMu.Lock()
	defer b.scrubMu.Unlock()
	o := &op{size: 64, apply: func(w *batch) error {
		w.set([]byte(scrubKey), nil, 0)
		return nil
	}, after: func() error {
		if err := b.db.DropPrefix([]byte(scrubKey)); err != nil {
			return fmt.Errorf("flushing the memtables: %w", err)
		}
		if b.journal != nil {
			if err := b.journal.scrub(); err != nil {
				return err
			}
		}
		return nil
	}}
	if err := b.submit(ctx, o); err != nil {
		return err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return store.ErrClosed
	}
	if err := b.db.Flatten(2); err != nil {
		return fmt.Errorf("compacting: %w", err)
	}
	return nil
}

// scrub checkpoints every record and zeroes both journal files, so that
// no record's bytes stay in them; the next record is written at the start
// of file 0. Only the committer calls it (no append runs meanwhile). A
// crash part-way is safe: every record is covered by the checkpoint, and
// a zeroed or half-zeroed file holds nothing replay takes.
func (j *journal) scrub() error {
	j.mu.Lock()
	for j.running {
		j.cond.Wait()
	}
	j.running = true
	j.mu.Unlock()
	defer func() {
		j.mu.Lock()
		j.running = false
		j.cond.Broadcast()
		j.mu.Unlock()
	}()
	if err := j.checkpoint(j.seq); err != nil {
		return err
	}
	zeros := make([]byte, 1<<20)
	for _, f := range j.files {
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("zeroing the journal: %w", err)
		}
		for off := int64(0); off < st.Size(); off += int64(len(zeros)) {
			if _, err := f.WriteAt(zeros[:min(int64(len(zeros)), st.Size()-off)], off); err != nil {
				return fmt.Errorf("zeroing the journal: %w", err)
			}
		}
		if err := j.sync(f); err != nil {
			return fmt.Errorf("zeroing the journal: %w", err)
		}
	}
	j.cur, j.off, j.last = 0, 0, [2]uint64{}
	return nil
}

// Interface guards
var _ store.Purger = (*Badger)(nil)
