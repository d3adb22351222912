package badgerstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// The claim scan seeks past ended leases but still finds every lease that
// lapsed: one of this open at its Until, and one handed to an earlier
// owner after the scan had found none of those.
func TestClaimFindsLapsedLeases(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	claim := func(now time.Time) string {
		t.Helper()
		recs, err := b.Claim(ctx, store.ClaimRequest{Now: now, Limit: 10, Lease: time.Hour, Decide: forward})
		if err != nil {
			t.Fatal(err)
		}
		return recIDs(recs)
	}
	// Leases that ended (delivered) before and after the one that lapses.
	for _, id := range []string{"a", "b", "c"} {
		mustInsert(t, b, testRecord(id, store.StateForwarding))
	}
	for _, id := range []string{"a", "c"} {
		if _, err := b.UpdateDelivery(ctx, key(id), func(d *store.Delivery) error {
			d.State, d.Lease = store.StateDelivered, store.Lease{}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if got := claim(t0); got != "" {
		t.Fatalf("claim before any lease lapsed = %q", got)
	}
	if got := claim(t0.Add(time.Minute)); got != "b" {
		t.Fatalf("claim when b's lease lapsed = %q, want b", got)
	}
	mustInsert(t, b, testRecord("d", store.StateForwarding))
	if _, err := b.UpdateDelivery(ctx, key("d"), func(d *store.Delivery) error {
		d.Lease.Owner = ownerName(0)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := claim(t0); got != "d" {
		t.Fatalf("claim after d's lease went to an earlier owner = %q, want d", got)
	}
	checkIndexesOK(t, b)
}

// Without any claim scan (the replay loop skips them while its slots are
// busy), the lease tracker keeps no entry per ended lease: its memory does
// not grow with the pingbacks forwarded. (An entry waits behind a lease
// still held that ends before it: at most the leases of one forward
// timeout.)
func TestLeaseTrackerForgetsEndedLeases(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	held := testRecord("held", store.StateForwarding)
	held.Lease.Until = t0.Add(time.Hour) // ends after the others
	mustInsert(t, b, held)
	for i := range 300 {
		id := fmt.Sprint(i)
		rec := testRecord(id, store.StateForwarding)
		rec.Lease.Until = t0.Add(time.Duration(i) * time.Millisecond) // forwarded one after the other
		mustInsert(t, b, rec)
		if _, err := b.UpdateDelivery(ctx, key(id), delivered); err != nil {
			t.Fatal(err)
		}
	}
	// Committed batches are applied to the tracker before their callers
	// return, so it can be read here.
	if len(b.leases.held) != 1 || b.leases.byEnd.Len() > 2 {
		t.Errorf("after 300 ended leases: %d held, %d in the heap; want the one held, and no more than 2", len(b.leases.held), b.leases.byEnd.Len())
	}
}
