package store

import (
	"testing"
	"time"
)

// The claim scan seeks past ended leases but still finds every lease that
// lapsed: one of this open at its Until, and one handed to an earlier
// owner after the scan had found none of those.
func TestClaimFindsLapsedLeases(t *testing.T) {
	b := openTestBadger(t, BadgerOptions{Dir: t.TempDir()})
	claim := func(now time.Time) string {
		t.Helper()
		recs, err := b.Claim(ctx, ClaimRequest{Now: now, Limit: 10, Lease: time.Hour, Decide: forward})
		if err != nil {
			t.Fatal(err)
		}
		return recIDs(recs)
	}
	// Leases that ended (delivered) before and after the one that lapses.
	for _, id := range []string{"a", "b", "c"} {
		mustInsert(t, b, testRecord(id, StateForwarding))
	}
	for _, id := range []string{"a", "c"} {
		if _, err := b.UpdateDelivery(ctx, key(id), func(d *Delivery) error {
			d.State, d.Lease = StateDelivered, Lease{}
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
	mustInsert(t, b, testRecord("d", StateForwarding))
	if _, err := b.UpdateDelivery(ctx, key("d"), func(d *Delivery) error {
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
