package storetest

import (
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// testExpiredState checks store.StateExpired, the state of a result the
// replay loop found older than its provider's max_age: a claim's Decide
// moves a due record to it (with Delivery.ExpiredReason), the record is
// then kept with its reason, counted and listed by state, never claimed
// again by due time, still claimed by key (a replay by hand, which clears
// the reason), kept across a restart, and reported by Expire at its
// retention's end.
func testExpiredState(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	end := t0.Add(2 * time.Hour) // the retention's end
	old, young := inState("old", t0, store.StateFailed), queued("young", t0, t0)
	old.ExpiresAt, young.ExpiresAt = end, end
	insert(t, s, old, young)

	now := t0.Add(time.Minute)
	recs := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: 10, DecideRecord: func(rec *store.Record, d *store.Delivery, lapsed bool) {
		if rec.ID == "old" {
			d.State, d.ExpiredReason, d.DueAt, d.UpdatedAt = store.StateExpired, "max_age", time.Time{}, now
			return
		}
		Forward(d, lapsed)
	}})
	wantIDs(t, "claim that expires one record", recs, "old", "young")
	for _, r := range recs {
		if r.ID == "old" && (r.State != store.StateExpired || r.ExpiredReason != "max_age" || r.Lease != (store.Lease{})) {
			t.Errorf("expired record returned as %s, reason %q, lease %+v", r.State, r.ExpiredReason, r.Lease)
		}
	}
	wantStored := func(what string, s store.Store, attempts int, counts map[store.State]int64) {
		t.Helper()
		got := get(t, s, "old")
		if got.State != store.StateExpired || got.ExpiredReason != "max_age" || !got.DueAt.IsZero() || got.Lease != (store.Lease{}) ||
			got.Attempts != attempts || got.Failures != old.Failures || got.LastError != old.LastError {
			t.Errorf("%s: stored as %s, reason %q, due %s, lease %+v, attempts %d, failures %d, last error %q", what, got.State,
				got.ExpiredReason, fmtTime(got.DueAt), got.Lease, got.Attempts, got.Failures, got.LastError)
		}
		if err := checkCounts(s, counts, -1); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		listed, err := s.List(ctx, store.Filter{Provider: prov, State: store.StateExpired}, 10)
		if err != nil {
			t.Fatal(err)
		}
		wantIDs(t, what+": List of state expired", listed, "old")
		page, err := s.ListPage(ctx, store.ListQuery{State: store.StateExpired, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		wantIDs(t, what+": ListPage of state expired", page.Records, "old")
		if len(page.Records) == 1 && page.Records[0].ExpiredReason != "max_age" {
			t.Errorf("%s: ListPage shows reason %q", what, page.Records[0].ExpiredReason)
		}
	}
	inFlight := map[store.State]int64{store.StateExpired: 1, store.StateForwarding: 1}
	wantStored("after the claim", s, old.Attempts, inFlight)
	// Never claimed again by due time (young's lease still holds).
	wantIDs(t, "claim after the expiry", h.claim(t, s, now.Add(leaseLen/2), 10))
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		wantStored("after a restart", s, old.Attempts, inFlight)
		// The restart let young's lease lapse: claim it back and deliver it.
		recs = h.claim(t, s, now.Add(time.Hour), 10)
		wantIDs(t, "claim after the restart", recs, "young")
	} else {
		recs = h.claim(t, s, now.Add(leaseLen+time.Hour), 10) // young's lease lapsed
		wantIDs(t, "claim of the lapsed lease", recs, "young")
	}
	for _, r := range recs {
		update(t, s, r.ID, func(d *store.Delivery) {
			d.State, d.Lease, d.UpdatedAt = store.StateDelivered, store.Lease{}, now.Add(time.Hour)
		})
	}

	// A replay by hand claims it by key; the reason goes with the state.
	later := now.Add(90 * time.Minute)
	recs = h.claimReq(t, s, store.ClaimRequest{Now: later, Limit: 1, Keys: []store.Key{key("old")}, Decide: func(d *store.Delivery, lapsed bool) {
		d.ExpiredReason = ""
		Forward(d, lapsed)
	}})
	wantIDs(t, "claim of the expired record by key", recs, "old")
	for _, r := range recs {
		checkLeased(t, s, r, later, leaseLen)
		if r.ExpiredReason != "" {
			t.Errorf("record claimed by key keeps expired_reason %q", r.ExpiredReason)
		}
	}
	// Its forward fails and the outcome expires it again (an update, as
	// the stand-alone delivery state is written).
	update(t, s, "old", func(d *store.Delivery) {
		d.State, d.ExpiredReason, d.Lease, d.UpdatedAt = store.StateExpired, "max_age", store.Lease{}, later
	})
	wantStored("after an update", s, old.Attempts+1, map[store.State]int64{store.StateExpired: 1, store.StateDelivered: 1})

	wantExpired(t, "the retention's end", expire(t, s, end, 10), map[string]store.State{"old": store.StateExpired})
	wantNotFound(t, s, "old")
	if err := checkCounts(s, nil, -1); err != nil {
		t.Errorf("after the retention's end: %v", err)
	}
}
