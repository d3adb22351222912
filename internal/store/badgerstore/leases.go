package badgerstore

import (
	"container/heap"
	"encoding/binary"
	"math"

	"github.com/caddy-pingback/pingback/internal/store"
)

// leaseTracker knows the leases this store handle holds, so that the claim
// scan seeks past the index entries of leases that ended. Those entries are
// deleted, but Badger's iterators step over deleted keys until compaction
// drops them: without the seek, the scan for lapsed leases would walk one
// deleted entry per callback ever forwarded, in the committer's serial
// section. It is used only from the committer goroutine, and changed only
// by commits that succeeded.
type leaseTracker struct {
	held  map[store.Key]uint64 // key → Until (Unix ns) of its lease of this epoch
	byEnd leaseHeap            // the same, earliest first, with stale entries
	// older is false once a claim scan found no lease of an earlier
	// epoch: none can appear again in this open.
	older bool
}

type leaseAt struct {
	key   store.Key
	until uint64
}

// leaseEvent is a lease of this epoch that a commit starts or ends, or
// (older) a lease of an earlier epoch that it starts.
type leaseEvent struct {
	leaseAt
	start bool
	older bool
}

func newLeaseTracker() *leaseTracker {
	return &leaseTracker{held: map[store.Key]uint64{}, older: true}
}

// apply records the lease changes of a committed batch, in order.
func (t *leaseTracker) apply(events []leaseEvent) {
	for _, e := range events {
		if e.older {
			t.older = true
			continue
		}
		if !e.start {
			if t.held[e.key] == e.until {
				delete(t.held, e.key)
			}
			continue
		}
		t.held[e.key] = e.until
		heap.Push(&t.byEnd, e.leaseAt)
	}
	// Drop ended leases from the top of the heap now, not only in the
	// next claim scan: the replay loop skips its claims while its slots
	// are busy or the store is unavailable, and the heap would grow by an
	// entry per pingback meanwhile.
	t.floor()
}

// floor is the earliest Until of a lease this handle holds; MaxUint64 if
// it holds none. No index entry of this epoch below it is a held lease.
func (t *leaseTracker) floor() uint64 {
	for t.byEnd.Len() > 0 {
		top := t.byEnd[0]
		if u, ok := t.held[top.key]; ok && u == top.until {
			return top.until
		}
		heap.Pop(&t.byEnd) // ended or renewed
	}
	return math.MaxUint64
}

// leaseScanStart is where the scan of this epoch's leases starts.
func leaseScanStart(epoch, floor uint64) []byte {
	b := append([]byte(leasePrefix), binary.BigEndian.AppendUint64(nil, epoch)...)
	return binary.BigEndian.AppendUint64(b, floor)
}

type leaseHeap []leaseAt

func (h leaseHeap) Len() int           { return len(h) }
func (h leaseHeap) Less(i, j int) bool { return h[i].until < h[j].until }
func (h leaseHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *leaseHeap) Push(x any)        { *h = append(*h, x.(leaseAt)) }
func (h *leaseHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
