package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// testEraseBatchPastStaleEntries: records that left their delivery
// behind (purged here) before their erasure was due do not use up a
// batch: ErasePayloads still erases limit records when that many are
// due, so that its caller, which stops at a batch short of limit, never
// stops while results due for erasure remain.
func testEraseBatchPastStaleEntries(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	var gone []store.Key
	for i := range 5 {
		r := inState(fmt.Sprint("gone-", i), t0, store.StateDelivered)
		r.UpdatedAt = t0.Add(time.Duration(i) * time.Second)
		insert(t, s, r)
		gone = append(gone, r.Key())
	}
	if n, err := s.Purge(ctx, store.PurgeQuery{Keys: gone}); err != nil || n != len(gone) {
		t.Fatalf("Purge = %d, %v; want %d", n, err, len(gone))
	}
	var due []*store.Record
	for i := range 2 {
		r := inState(fmt.Sprint("due-", i), t0, store.StateDelivered)
		r.UpdatedAt = t0.Add(time.Duration(10+i) * time.Second)
		insert(t, s, r)
		due = append(due, get(t, s, r.ID))
	}
	if n := erase(t, s, t0.Add(time.Minute), 2); n != 2 {
		t.Errorf("ErasePayloads(limit 2) erased %d, want 2: the purged records' entries used up the batch", n)
	}
	for _, r := range due {
		wantErased(t, s, r.ID, r)
	}
	if n := erase(t, s, t0.Add(time.Minute), 2); n != 0 {
		t.Errorf("ErasePayloads again erased %d, want 0", n)
	}
}
