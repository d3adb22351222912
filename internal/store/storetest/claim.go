package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

func testClaimDueEarliestFirst(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	failed := inState("f1", t0, store.StateFailed)
	failed.DueAt = t0.Add(time.Second)
	insert(t, s,
		queued("q3", t0, t0.Add(3*time.Second)), // due exactly at the claim
		failed,
		queued("q2", t0, t0.Add(2*time.Second)),
		queued("q9", t0, t0.Add(9*time.Second)), // not yet due
		inState("d", t0, store.StateDelivered),
		inState("p", t0, store.StateParked),
		inState("r", t0, store.StateRejected),
	)
	before := map[string]*store.Record{}
	for _, id := range []string{"f1", "q2", "q3"} {
		before[id] = get(t, s, id)
	}

	now := t0.Add(3 * time.Second)
	var seen []string
	recs := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: 10, Decide: func(d *store.Delivery, lapsed bool) {
		seen = append(seen, fmt.Sprintf("%s/%v", d.State, lapsed))
		Forward(d, lapsed)
	}})
	wantIDs(t, "claim of due records", recs, "f1", "q2", "q3")
	for _, x := range seen {
		if x != "queued/false" && x != "failed/false" {
			t.Errorf("Decide saw %s; want a queued or failed record that did not lapse", x)
		}
	}
	for _, r := range recs {
		checkLeased(t, s, r, now, leaseLen)
		want := cloneRecord(before[r.ID])
		want.Delivery = r.Delivery
		if d := diffRecord(r, want); d != "" {
			t.Errorf("claimed %s: %s (a claim returns the whole record)", r.ID, d)
		}
		if r.Attempts != before[r.ID].Attempts+1 || r.Interrupts != 0 {
			t.Errorf("claimed %s: attempts %d interrupts %d; want Decide's attempts %d, no interrupt",
				r.ID, r.Attempts, r.Interrupts, before[r.ID].Attempts+1)
		}
		if r.Failures != before[r.ID].Failures || r.LastStatus != before[r.ID].LastStatus {
			t.Errorf("claimed %s: failures %d last status %d changed", r.ID, r.Failures, r.LastStatus)
		}
	}
	wantIDs(t, "second claim at the same time", h.claim(t, s, now, 10))
	wantIDs(t, "claim when the last record is due", h.claim(t, s, t0.Add(9*time.Second), 10), "q9")
	wantIDs(t, "claim with every record leased or settled", h.claim(t, s, t0.Add(30*time.Second), 10))
}

func testClaimLimit(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	for i := range 5 {
		insert(t, s, queued(fmt.Sprint(i), t0, t0.Add(time.Duration(5-i)*time.Second)))
	}
	now := t0.Add(10 * time.Second)
	wantIDs(t, "first claim of 2", h.claim(t, s, now, 2), "4", "3")
	wantIDs(t, "second claim of 2", h.claim(t, s, now, 2), "2", "1")
	wantIDs(t, "third claim of 2", h.claim(t, s, now, 2), "0")
	wantIDs(t, "fourth claim of 2", h.claim(t, s, now, 2))
}

func testClaimDecideParks(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	tired := inState("tired", t0, store.StateFailed)
	tired.Attempts, tired.Failures = 5, 5
	insert(t, s, tired, queued("fresh", t0, t0.Add(time.Second)))
	decide := func(d *store.Delivery, lapsed bool) {
		if d.Attempts >= 5 {
			d.State, d.DueAt, d.LastError = store.StateParked, time.Time{}, "parked: too many attempts"
			return
		}
		Forward(d, lapsed)
	}
	now := t0.Add(time.Second)
	recs := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: 10, Decide: decide})
	wantIDs(t, "claim that parks one record", recs, "tired", "fresh")
	if len(recs) == 2 {
		p := recs[0]
		if p.State != store.StateParked || p.Lease != (store.Lease{}) || !p.DueAt.IsZero() || p.LastError != "parked: too many attempts" || p.Attempts != 5 {
			t.Errorf("parked record returned as %s lease %+v due %s error %q attempts %d", p.State, p.Lease, fmtTime(p.DueAt), p.LastError, p.Attempts)
		}
		checkLeased(t, s, recs[1], now, leaseLen)
	}
	if got := get(t, s, "tired"); got.State != store.StateParked || got.Lease != (store.Lease{}) || got.LastError != "parked: too many attempts" {
		t.Errorf("stored parked record: %s lease %+v error %q", got.State, got.Lease, got.LastError)
	}
	wantIDs(t, "claim after parking", h.claim(t, s, now.Add(30*time.Second), 10))
	// A parked record is still claimed by key (a replay by hand).
	recs = h.claimKeys(t, s, now.Add(30*time.Second), "tired")
	wantIDs(t, "claim of the parked record by key", recs, "tired")
	for _, r := range recs {
		checkLeased(t, s, r, now.Add(30*time.Second), leaseLen)
	}
}

func testClaimKeys(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	later := t0.Add(time.Hour)
	notDue := func(r *store.Record) *store.Record { r.DueAt = later; return r }
	tests := []struct {
		rec  *store.Record
		want bool
	}{
		{notDue(inState("queued", t0, store.StateQueued)), true},
		{notDue(inState("failed", t0, store.StateFailed)), true},
		{inState("delivered", t0, store.StateDelivered), true},
		{inState("rejected", t0, store.StateRejected), true},
		{inState("parked", t0, store.StateParked), true},
		{inState("forwarding", t0, store.StateForwarding), false}, // leased until t0+1m
	}
	for _, tc := range tests {
		insert(t, s, tc.rec)
	}
	now := t0.Add(time.Second)
	for _, tc := range tests {
		recs := h.claimKeys(t, s, now, tc.rec.ID)
		if !tc.want {
			wantIDs(t, "claim by key of a record under a live lease", recs)
			continue
		}
		wantIDs(t, "claim by key of a "+tc.rec.ID+" record", recs, tc.rec.ID)
		for _, r := range recs {
			checkLeased(t, s, r, now, leaseLen)
			if r.Attempts != tc.rec.Attempts+1 || r.Code != tc.rec.Code {
				t.Errorf("%s claimed with attempts %d code %q", r.ID, r.Attempts, r.Code)
			}
		}
		// Now leased: a second claim by key does not take it.
		wantIDs(t, "second claim by key of "+tc.rec.ID, h.claimKeys(t, s, now, tc.rec.ID))
	}
	wantIDs(t, "claim by an unknown key", h.claimKeys(t, s, now, "404"))
	wantIDs(t, "plain claim after the claims by key", h.claim(t, s, now.Add(time.Second), 10))

	// One claim names the same record twice: it is returned once.
	insert(t, s, inState("twice", t0, store.StateParked))
	wantIDs(t, "claim naming a record twice", h.claimKeys(t, s, now, "twice", "twice"), "twice")
	if got := get(t, s, "twice"); got.Attempts != 6 {
		t.Errorf("record named twice in one claim: attempts %d, want one more (6)", got.Attempts)
	}
}

func testClaimConcurrent(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	const records, claimers = 150, 12
	insertAll(t, s, records, func(i int) *store.Record {
		return queued(fmt.Sprintf("%03d", i), t0, t0.Add(time.Duration(i%7)*time.Millisecond))
	})

	now := t0.Add(time.Second)
	start := make(chan struct{})
	var mu sync.Mutex
	claimed := map[string]int{}
	var errs []error
	var wg sync.WaitGroup
	for range claimers {
		wg.Go(func() {
			<-start
			for {
				recs, err := h.claimAt(s, store.ClaimRequest{Now: now, Limit: 4, Lease: leaseLen, Decide: Forward})
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, r := range recs {
					claimed[r.ID]++
				}
				mu.Unlock()
				if err != nil || len(recs) == 0 {
					return
				}
			}
		})
	}
	// And claims by key of one record, all at once.
	insert(t, s, inState("one", t0, store.StateParked))
	var byKey int
	for range claimers {
		wg.Go(func() {
			<-start
			recs, err := h.claimAt(s, store.ClaimRequest{Now: now, Limit: 1, Keys: []store.Key{key("one")}, Lease: leaseLen, Decide: Forward})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			byKey += len(recs)
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		t.Errorf("concurrent Claim: %v", err)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Errorf("record %s was claimed %d times", id, n)
		}
	}
	if len(claimed) != records {
		t.Errorf("%d of %d due records were claimed", len(claimed), records)
	}
	if byKey != 1 {
		t.Errorf("%d concurrent claims by key took the record %d times, want once", claimers, byKey)
	}
	if got := get(t, s, "one"); got.Attempts != 6 {
		t.Errorf("record claimed by key: attempts %d, want 6 (one claim)", got.Attempts)
	}
}

// insertAll inserts n records from n goroutines.
func insertAll(t *testing.T, s store.Store, n int, rec func(i int) *store.Record) {
	t.Helper()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := rec(i)
			res, err := s.Insert(ctx, r)
			if err == nil && res.Existing != nil {
				err = fmt.Errorf("Insert(%s): unexpected duplicate", r.Key())
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func testRestart(t *testing.T, h Harness) {
	if h.Reopen == nil {
		t.Skip("the harness has no Reopen")
	}
	s := h.Open(t)
	t0 := base()
	live := inState("live", t0, store.StateForwarding) // a live forward cut by the restart
	live.Attempts, live.Lease.Until, live.LastStatus, live.LastError = 2, t0.Add(time.Hour), 503, "app answered 503"
	insert(t, s, live, queued("claimed", t0, t0), queued("wait", t0, t0.Add(30*time.Second)), inState("done", t0, store.StateDelivered))
	wantIDs(t, "claim before the restart", h.claim(t, s, t0, 10), "claimed")
	if _, err := s.AddTask(ctx, newTask("task", t0, t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	before := map[string]*store.Record{}
	for _, id := range []string{"live", "claimed", "wait", "done"} {
		before[id] = get(t, s, id)
	}
	owner1 := s.Owner()

	s = h.Reopen(t, s)
	if s.Owner() == owner1 {
		t.Fatalf("the reopened store has the same owner %q", owner1)
	}
	for id, want := range before {
		if d := diffRecord(get(t, s, id), want); d != "" {
			t.Errorf("%s after the restart: %s", id, d)
		}
	}
	if gt, err := s.GetTask(ctx, key("task")); err != nil || gt.State != store.TaskPending {
		t.Errorf("task after the restart = %+v, %v", gt, err)
	}
	if res, err := s.Insert(ctx, queued("done", t0, t0)); err != nil || res.Existing == nil {
		t.Errorf("duplicate Insert after the restart = %+v, %v; want the stored record", res, err)
	}
	// The earlier handle's lease is not this one's to renew.
	if err := s.Renew(ctx, key("live"), 2, t0.Add(2*time.Hour)); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew of a lease of the previous open: %v, want ErrLeaseLost", err)
	}

	// Both leases lapsed with their owner: the next claim takes them at
	// once, long before their Until.
	now := t0.Add(time.Second)
	recs := h.claim(t, s, now, 10)
	got := ids(recs)
	slices.Sort(got)
	if !slices.Equal(got, []string{"claimed", "live"}) {
		t.Fatalf("claim after the restart = %v, want [claimed live]", got)
	}
	for _, r := range recs {
		b := before[r.ID]
		checkLeased(t, s, r, now, leaseLen)
		checkReason(t, "lapsed "+r.ID, r.LastError, h.RestartReason)
		if r.LastStatus != 0 || r.Interrupts != b.Interrupts+1 || r.Attempts != b.Attempts+1 {
			t.Errorf("lapsed %s: last status %d interrupts %d attempts %d; want 0, %d (Decide told it lapsed), %d",
				r.ID, r.LastStatus, r.Interrupts, r.Attempts, b.Interrupts+1, b.Attempts+1)
		}
	}
	wantIDs(t, "second claim after the restart", h.claim(t, s, now, 10))
	wantIDs(t, "claim when the waiting record is due", h.claim(t, s, t0.Add(30*time.Second), 10), "wait")

	// Every restart ends every lease of the handle before it.
	s = h.Reopen(t, s)
	recs = h.claim(t, s, t0.Add(40*time.Second), 10)
	got = ids(recs)
	slices.Sort(got)
	if !slices.Equal(got, []string{"claimed", "live", "wait"}) {
		t.Errorf("claim after the second restart = %v, want [claimed live wait]", got)
	}
}

// testLeaseTerm checks that a lease lapses at its Until and that Renew
// extends it: with the lease a claim asks for on a store without a lease
// term (where Until is a safety net), and with the lease term on a store
// whose leases must be renewed.
func testLeaseTerm(t *testing.T, h Harness) {
	t.Run("until", func(t *testing.T) {
		s := h.Open(t)
		term := leaseLen
		if s.LeaseTerm() > 0 {
			term = s.LeaseTerm()
		}
		testLeaseLapse(t, h, s, term)
	})
	t.Run("term", func(t *testing.T) {
		s := leaseTermStore(t, h)
		testLeaseLapse(t, h, s, s.LeaseTerm())
	})
}

func testLeaseLapse(t *testing.T, h Harness, s store.Store, term time.Duration) {
	t0 := base()
	insert(t, s, queued("a", t0, t0))
	req := func(now time.Time, keys ...string) store.ClaimRequest {
		r := store.ClaimRequest{Now: now, Limit: 10, Lease: term}
		for _, id := range keys {
			r.Keys = append(r.Keys, key(id))
		}
		return r
	}
	recs := h.claimReq(t, s, req(t0))
	wantIDs(t, "first claim", recs, "a")
	for _, r := range recs {
		checkLeased(t, s, r, t0, term)
	}
	justBefore := t0.Add(term - time.Nanosecond)
	wantIDs(t, "claim just before the lease runs out", h.claimReq(t, s, req(justBefore)))
	wantIDs(t, "claim by key just before the lease runs out", h.claimReq(t, s, req(justBefore, "a")))

	// Renewed, the lease holds past its first term.
	if err := s.Renew(ctx, key("a"), 99, t0.Add(2*term)); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew for the wrong attempt: %v, want ErrLeaseLost", err)
	}
	if err := s.Renew(ctx, key("a"), 1, t0.Add(2*term)); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if got := get(t, s, "a"); got.Lease.Owner != s.Owner() || !got.Lease.Until.Equal(t0.Add(2*term)) || got.State != store.StateForwarding {
		t.Errorf("after Renew: %s lease %+v; want forwarding until %s", got.State, got.Lease, fmtTime(t0.Add(2*term)))
	}
	wantIDs(t, "claim at the first term's end, after a renewal", h.claimReq(t, s, req(t0.Add(term))))
	wantIDs(t, "claim just before the renewed lease runs out", h.claimReq(t, s, req(t0.Add(2*term-time.Nanosecond))))

	// Run out: claimable, as lapsed.
	now := t0.Add(2 * term)
	recs = h.claimReq(t, s, req(now))
	wantIDs(t, "claim when the renewed lease ran out", recs, "a")
	for _, r := range recs {
		checkLeased(t, s, r, now, term)
		checkReason(t, "lapsed lease", r.LastError, h.ExpiredReason)
		if r.Attempts != 2 || r.Interrupts != 1 || r.LastStatus != 0 {
			t.Errorf("lapsed lease claimed with attempts %d interrupts %d last status %d; want 2, 1 (lapsed), 0", r.Attempts, r.Interrupts, r.LastStatus)
		}
	}
	// The first attempt's lease is gone for good; the second's renews.
	if err := s.Renew(ctx, key("a"), 1, now.Add(term)); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew of a lease another claim took: %v, want ErrLeaseLost", err)
	}
	if err := s.Renew(ctx, key("a"), 2, now.Add(3*term)); err != nil {
		t.Errorf("Renew of the current attempt: %v", err)
	}
	update(t, s, "a", func(d *store.Delivery) { d.State = store.StateDelivered })
	if err := s.Renew(ctx, key("a"), 2, now.Add(3*term)); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew of a delivered record: %v, want ErrLeaseLost", err)
	}
	insert(t, s, queued("q", t0, now.Add(time.Hour)))
	if err := s.Renew(ctx, key("q"), 0, now.Add(time.Hour)); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew of a queued record: %v, want ErrLeaseLost", err)
	}
	if err := s.Renew(ctx, key("404"), 1, now.Add(time.Hour)); !errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Renew of an unknown record: %v, want ErrLeaseLost or ErrNotFound", err)
	}

	// A live forward inserted with its lease runs out like a claimed one
	// and is claimed by key too once it did.
	live := inState("live", t0, store.StateForwarding)
	live.Lease.Until, live.LastStatus = t0.Add(term), 503
	insert(t, s, live)
	wantIDs(t, "claim by key of a live insert's lease", h.claimReq(t, s, req(justBefore, "live")))
	recs = h.claimReq(t, s, req(t0.Add(term), "live"))
	wantIDs(t, "claim by key of a lapsed insert's lease", recs, "live")
	for _, r := range recs {
		checkLeased(t, s, r, t0.Add(term), term)
		checkReason(t, "lapsed insert's lease", r.LastError, h.ExpiredReason)
		if r.Interrupts != 1 || r.LastStatus != 0 {
			t.Errorf("lapsed insert's lease: interrupts %d last status %d, want 1 and 0", r.Interrupts, r.LastStatus)
		}
	}
}

// testClaimDecideRecord: DecideRecord is used instead of Decide and sees
// each claimable record's other fields as stored, those an UpdateRecord
// changed included (the replay loop names an attempt's source from them),
// whether the claim is of due records or by key; what it does to the
// delivery is what Claim stores.
func testClaimDecideRecord(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	polled := queued("polled", t0, t0)
	polled.Source = store.SourcePoll
	corrected := queued("corrected", t0, t0.Add(time.Second))
	insert(t, s, polled, corrected)
	if _, err := s.UpdateRecord(ctx, key("corrected"), func(r *store.Record) error {
		r.Code, r.OtherCode, r.Correction = "REAL", r.Code, true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	decide := func(rec *store.Record, d *store.Delivery, lapsed bool) {
		seen[rec.ID] = fmt.Sprintf("%s %s %v %d", rec.Source, rec.Code, rec.Correction, d.Attempts)
		Forward(d, lapsed)
		d.LastError = "decided for " + rec.ID
	}
	now := t0.Add(time.Second)
	recs := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: 10, DecideRecord: decide})
	wantIDs(t, "claim with DecideRecord", recs, "polled", "corrected")
	want := map[string]string{"polled": "poll CODE-polled false 0", "corrected": "callback REAL true 0"}
	for id, w := range want {
		if seen[id] != w {
			t.Errorf("DecideRecord saw %s as %q, want %q", id, seen[id], w)
		}
		if got := get(t, s, id); got.State != store.StateForwarding || got.Attempts != 1 || got.LastError != "decided for "+id {
			t.Errorf("stored %s: %s attempts %d error %q; want DecideRecord's delivery", id, got.State, got.Attempts, got.LastError)
		}
	}
	clear(seen)
	parked := inState("parked", t0, store.StateParked)
	parked.Source = store.SourcePoll
	insert(t, s, parked)
	recs = h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: 1, Keys: []store.Key{key("parked")}, DecideRecord: decide})
	wantIDs(t, "claim by key with DecideRecord", recs, "parked")
	if seen["parked"] != "poll CODE-parked false "+fmt.Sprint(parked.Attempts) {
		t.Errorf("DecideRecord by key saw %q", seen["parked"])
	}
}
