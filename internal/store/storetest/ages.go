package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// checkAge compares one of s.Ages' maps (named what, picked by pick) for
// the suite's provider with want (zero: the provider must be absent), to
// the second: a store may keep ages by the second.
func checkAge(s store.Store, what string, pick func(store.Ages) map[string]time.Time, want time.Time) error {
	a, err := s.Ages(ctx)
	if err != nil {
		return fmt.Errorf("reading the ages: %v", err)
	}
	got, ok := pick(a)[prov]
	switch {
	case want.IsZero() && ok:
		return fmt.Errorf("ages: %s[%s] = %s, want none", what, prov, fmtTime(got))
	case !want.IsZero() && (!ok || got.Unix() != want.Unix()):
		return fmt.Errorf("ages: %s[%s] = %s (set %v), want %s", what, prov, fmtTime(got), ok, fmtTime(want))
	}
	for p := range pick(a) {
		if p != prov {
			return fmt.Errorf("ages: %s has provider %q the suite never stored", what, p)
		}
	}
	return nil
}

var (
	pendingAge  = func(a store.Ages) map[string]time.Time { return a.OldestPendingTask }
	backlogAge  = func(a store.Ages) map[string]time.Time { return a.OldestUndelivered }
	lastLiveAge = func(a store.Ages) map[string]time.Time { return a.LastCallback }
)

// testAges checks that the ages follow tasks added, completed and expired,
// records entering and leaving the backlog (failed, forwarding) by insert,
// update, claim and expiry, and live pingbacks stored (not duplicates, not
// polled results), across a restart.
func testAges(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	step := func(what string, pending, backlog, live time.Time) {
		t.Helper()
		for _, c := range []struct {
			name string
			pick func(store.Ages) map[string]time.Time
			want time.Time
		}{{"OldestPendingTask", pendingAge, pending}, {"OldestUndelivered", backlogAge, backlog}, {"LastCallback", lastLiveAge, live}} {
			if err := checkAge(s, c.name, c.pick, c.want); err != nil {
				t.Errorf("after %s: %v", what, err)
			}
		}
	}
	var none time.Time
	step("nothing", none, none, none)
	for i, id := range []string{"t1", "t2", "t3"} {
		if _, err := s.AddTask(ctx, newTask(id, t0.Add(time.Duration(i-10)*time.Minute), t0.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	step("three tasks", t0.Add(-10*time.Minute), none, none)
	// t1's result, live, forwarding: completes the oldest task.
	live := inState("t1", t0.Add(-2*time.Minute), store.StateForwarding)
	insert(t, s, live)
	step("t1's pingback", t0.Add(-9*time.Minute), t0.Add(-2*time.Minute), t0.Add(-2*time.Minute))
	// An older failed result enters the backlog; a polled one does not
	// move the last callback; nor does a later duplicate.
	failed := inState("f1", t0.Add(-5*time.Minute), store.StateFailed)
	polled := inState("p1", t0.Add(-time.Minute), store.StateQueued)
	polled.Source = store.SourcePoll
	insert(t, s, failed, polled)
	if res, err := s.Insert(ctx, inState("t1", t0, store.StateForwarding)); err != nil || res.Existing == nil {
		t.Fatalf("duplicate insert: %+v, %v", res, err)
	}
	step("a failed, a polled and a duplicate result", t0.Add(-9*time.Minute), t0.Add(-5*time.Minute), t0.Add(-2*time.Minute))
	update(t, s, "f1", func(d *store.Delivery) { d.State, d.DueAt = store.StateDelivered, time.Time{} })
	step("the failed one delivered", t0.Add(-9*time.Minute), t0.Add(-2*time.Minute), t0.Add(-2*time.Minute))
	update(t, s, "t1", func(d *store.Delivery) { d.State, d.Lease = store.StateRejected, store.Lease{} })
	step("the live one rejected", t0.Add(-9*time.Minute), none, t0.Add(-2*time.Minute))
	// The polled one is claimed: forwarding, in the backlog by its
	// received time.
	wantIDs(t, "claim", h.claim(t, s, t0, 10), "p1")
	step("the polled one claimed", t0.Add(-9*time.Minute), t0.Add(-time.Minute), t0.Add(-2*time.Minute))
	update(t, s, "p1", func(d *store.Delivery) { d.State, d.Lease, d.DueAt = store.StateFailed, store.Lease{}, t0 })
	step("the polled one failed", t0.Add(-9*time.Minute), t0.Add(-time.Minute), t0.Add(-2*time.Minute))
	if _, err := s.UpdateTask(ctx, key("t2"), func(tk *store.Task) error {
		tk.State, tk.NextPollAt = store.TaskExpired, time.Time{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	step("t2 expired", t0.Add(-8*time.Minute), t0.Add(-time.Minute), t0.Add(-2*time.Minute))
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		step("a restart", t0.Add(-8*time.Minute), t0.Add(-time.Minute), t0.Add(-2*time.Minute))
	}
	// Retention: the failed one is forgotten; the last callback stays.
	if _, err := s.Expire(ctx, t0.Add(retention+time.Second), 100); err != nil {
		t.Fatal(err)
	}
	if err := checkAge(s, "OldestUndelivered", backlogAge, none); err != nil {
		t.Errorf("after expiry: %v", err)
	}
	if err := checkAge(s, "LastCallback", lastLiveAge, t0.Add(-2*time.Minute)); err != nil {
		t.Errorf("after expiry: %v", err)
	}
}

// testHistory checks that the history of attempts is stored with the
// delivery state: at insert, through updates (the first one of a record
// stored forwarding included), claims and a restart, bounded by
// StartAttempt to MaxHistory.
func testHistory(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	rec := inState("h1", t0, store.StateForwarding)
	rec.StartAttempt(store.SourceCallback, t0)
	insert(t, s, rec)
	want := rec.Delivery
	want.Lease.Owner = s.Owner()
	check := func(what string) {
		t.Helper()
		r := get(t, s, "h1")
		if d := diffHistory(r.History, want.History); d != "" {
			t.Errorf("after %s: history %s", what, d)
		}
	}
	check("insert")
	end := func(d *store.Delivery, status int) {
		d.State, d.Lease, d.DueAt, d.Failures = store.StateFailed, store.Lease{}, t0, d.Failures+1
		d.EndAttempt(d.Attempts, t0.Add(time.Second), status, store.OutcomeFailed, "app answered 503")
	}
	update(t, s, "h1", func(d *store.Delivery) { end(d, 503) })
	end(&want, 503)
	check("the first attempt's end")
	if want.History[0].Outcome != store.OutcomeFailed || want.History[0].EndedAt.IsZero() {
		t.Fatalf("EndAttempt did not end the attempt: %+v", want.History)
	}
	recs, err := h.claimAt(s, store.ClaimRequest{Now: t0, Limit: 1, Keys: []store.Key{key("h1")}, Lease: leaseLen,
		Decide: func(d *store.Delivery, lapsed bool) {
			d.State, d.Attempts = store.StateForwarding, d.Attempts+1
			d.StartAttempt(store.SourceManual, t0.Add(2*time.Second))
		}})
	if err != nil || len(recs) != 1 {
		t.Fatalf("claim: %v, %v", recs, err)
	}
	want.State, want.Attempts, want.DueAt = store.StateForwarding, want.Attempts+1, time.Time{}
	want.StartAttempt(store.SourceManual, t0.Add(2*time.Second))
	if d := diffHistory(recs[0].History, want.History); d != "" {
		t.Errorf("claimed record's history %s", d)
	}
	check("a claim")
	// Many more attempts: the first and the latest are kept.
	for i := range 2 * store.MaxHistory {
		fn := func(d *store.Delivery) {
			if d.State == store.StateForwarding {
				end(d, 500+i%10)
				return
			}
			d.State, d.Attempts, d.DueAt = store.StateForwarding, d.Attempts+1, time.Time{}
			d.StartAttempt(store.SourceReplay, t0.Add(time.Duration(3+i)*time.Second))
		}
		update(t, s, "h1", fn)
		fn(&want)
	}
	check("many attempts")
	if n := len(want.History); n != store.MaxHistory || want.History[0].Attempt != 1 || want.History[n-1].Attempt != want.Attempts {
		t.Errorf("history kept %d attempts, first %d, last %d; want %d, 1 and %d", n, want.History[0].Attempt,
			want.History[n-1].Attempt, store.MaxHistory, want.Attempts)
	}
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		check("a restart")
	}
}
