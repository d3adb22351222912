package badgerstore

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// presence is what the committer knows is absent from the store, so that
// a pingback's insert skips reads that would find nothing: a lookup of a
// key Badger does not hold walks both memtables and every level of the LSM
// (a bloom filter per table), about as costly as one that finds its key.
//
//   - tombstones is false while the store holds no tombstone (g/, written by
//     a purge): the insert's "was this result purged" lookup is then skipped.
//   - tasks names the providers with at least one task (t/, written by
//     pingback_track's submissions): the insert's task lookup is skipped for
//     any other provider (a route without pingback_track has no task to
//     complete).
//
// Both only ever turn from absent to present while the store is open (every
// committed write of a g/ or t/ key sets them, before the commit; a
// tombstone or task that later expires or is deleted leaves them set), and
// are read again from Badger at each open, after the journal's replay. A
// flag that is set when nothing is there costs one lookup, never a wrong
// answer. Owned by the committer: no lock.
type presence struct {
	tombstones bool
	tasks      map[string]bool
}

// readPresence reads the presence flags from the store: a seek to the
// tombstones' prefix, and one seek per provider with tasks.
func readPresence(w *batch) *presence {
	p := &presence{tasks: map[string]bool{}}
	it := w.txn.NewIterator(badger.IteratorOptions{Prefix: []byte(purgedPrefix)})
	it.Seek([]byte(purgedPrefix))
	p.tombstones = it.Valid()
	it.Close()
	for _, provider := range w.segments(taskPrefix) {
		p.tasks[provider] = true
	}
	return p
}

// note sets the flags the writes of a batch call for, before it commits.
func (p *presence) note(writes []write) {
	for _, x := range writes {
		if x.del || len(x.key) < 2 || x.key[1] != '/' {
			continue
		}
		switch x.key[0] {
		case purgedPrefix[0]:
			p.tombstones = true
		case taskPrefix[0]:
			if i := bytes.IndexByte(x.key[2:], '/'); i >= 0 && !p.tasks[string(x.key[2:2+i])] {
				p.tasks[string(x.key[2:2+i])] = true
			}
		}
	}
}

// mayHoldTombstone reports whether a tombstone lookup can find anything
// (true without presence flags: a read-only view).
func (w *batch) mayHoldTombstone() bool { return w.has == nil || w.has.tombstones }

// mayHoldTask reports whether a task of provider can be there.
func (w *batch) mayHoldTask(provider string) bool { return w.has == nil || w.has.tasks[provider] }

// checkAbsent panics if key is in the store (SelfCheck: a presence flag
// said it could not be).
func (w *batch) checkAbsent(key []byte) {
	if _, err := w.get(key); !errors.Is(err, store.ErrNotFound) {
		panic(fmt.Sprintf("store: presence flags skipped a lookup of %q, which the store holds (%v)", key, err))
	}
}
