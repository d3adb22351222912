package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// withFailures is a failed record due at due after n failures.
func withFailures(id string, t0, due time.Time, n int) *store.Record {
	r := inState(id, t0, store.StateFailed)
	r.Attempts, r.Failures, r.DueAt = n, n, due
	return r
}

// lapsedAt is a forward of t0 whose lease ends at until.
func lapsedAt(id string, t0, until time.Time) *store.Record {
	r := inState(id, t0, store.StateForwarding)
	r.Lease.Until = until
	return r
}

// testClaimFair: with Reserved, a claim takes lapsed leases first, then up
// to Reserved due records with at most FewFailures failures (earliest due
// first), then the rest by due time, each record once; without Reserved, a
// backlog of records that failed many times and are due earlier starves a
// record that failed once or twice.
func testClaimFair(t *testing.T, h Harness) {
	const backlog = 20
	setup := func(t *testing.T, s store.Store, t0 time.Time) {
		insertAll(t, s, backlog, func(i int) *store.Record {
			return withFailures(fmt.Sprintf("b%02d", i), t0, t0.Add(time.Duration(i)*time.Millisecond), 3+i%3)
		})
		insert(t, s,
			withFailures("f3", t0, t0.Add(500*time.Millisecond), store.FewFailures+1), // one failure too many
			withFailures("f2", t0, t0.Add(time.Second), store.FewFailures),
			queued("f0", t0, t0.Add(2*time.Second)),
			withFailures("late", t0, t0.Add(time.Hour), 1), // not due
		)
	}
	tests := []struct {
		name            string
		limit, reserved int
		lapsed          bool // a lapsed lease, "cut", is there too
		want            []string
	}{
		{"no reservation: oldest first", 4, 0, false, []string{"b00", "b01", "b02", "b03"}},
		{"reserved 2 of 4", 4, 2, false, []string{"f2", "f0", "b00", "b01"}},
		{"reserved 1 of 4", 4, 1, false, []string{"f2", "b00", "b01", "b02"}},
		{"reserved beyond the few-failure records", 4, 3, false, []string{"f2", "f0", "b00", "b01"}},
		{"reserved beyond the limit", 2, 5, false, []string{"f2", "f0"}},
		{"reserved with every record taken", 30, 2, false, append(append([]string{"f2", "f0"}, backlogIDs(backlog)...), "f3")},
		{"lapsed leases first", 4, 2, true, []string{"cut", "f2", "f0", "b00"}},
		{"lapsed leases first, no reservation", 2, 0, true, []string{"cut", "b00"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := h.Open(t)
			t0 := base()
			setup(t, s, t0)
			if tc.lapsed {
				insert(t, s, lapsedAt("cut", t0, t0.Add(time.Second)))
			}
			now := t0.Add(3 * time.Second)
			recs := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: tc.limit, Reserved: tc.reserved})
			wantIDs(t, "claim", recs, tc.want...)
			for _, r := range recs {
				checkLeased(t, s, r, now, leaseLen)
			}
			// What the claim left is claimed next, each record once.
			taken := map[string]bool{}
			for _, r := range recs {
				taken[r.ID] = true
			}
			for _, r := range h.claim(t, s, now, 100) {
				if taken[r.ID] {
					t.Errorf("%s claimed twice", r.ID)
				}
				taken[r.ID] = true
			}
			if want := backlog + 3 + btoi(tc.lapsed); len(taken) != want {
				t.Errorf("%d records claimed in all, want %d (every due record and lapsed lease)", len(taken), want)
			}
			if taken["late"] {
				t.Error("a record not due was claimed")
			}
		})
	}
}

func backlogIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("b%02d", i)
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// onRoute is a queued record due at due whose request is for host.
func onRoute(id, host string, t0, due time.Time) *store.Record {
	r := queued(id, t0, due)
	r.Request.Host = host
	return r
}

// byHost is the suite's ClaimRequest.Route: the request's host.
func byHost(rec *store.Record) string { return rec.Request.Host }

// testClaimRoom: a claim takes at most Room[route] records of a limited
// route, in every pass (lapsed leases, fair, by due time, the room shared
// among them); a route absent from Room is not limited; a skipped record
// is not shown to Decide, not returned, and left as it was, claimable
// later.
func testClaimRoom(t *testing.T, h Harness) {
	tests := []struct {
		name     string
		room     map[string]int
		reserved int
		want     []string
	}{
		{"no room map", nil, 0, []string{"la", "a1", "a2", "a3", "b1", "b2", "c1"}},
		{"room 1", map[string]int{"a": 1}, 0, []string{"la", "b1", "b2", "c1"}},
		{"room 2", map[string]int{"a": 2}, 0, []string{"la", "a1", "b1", "b2", "c1"}},
		{"room 0", map[string]int{"a": 0}, 0, []string{"b1", "b2", "c1"}},
		{"two routes limited", map[string]int{"a": 0, "b": 1}, 0, []string{"b1", "c1"}},
		{"room of an unknown route", map[string]int{"z": 0}, 0, []string{"la", "a1", "a2", "a3", "b1", "b2", "c1"}},
		{"room shared by the fair pass and the rest", map[string]int{"a": 2}, 2, []string{"la", "a1", "b1", "b2", "c1"}},
		{"fair pass skips a route without room", map[string]int{"a": 0}, 1, []string{"b1", "b2", "c1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := h.Open(t)
			t0 := base()
			la := lapsedAt("la", t0, t0.Add(time.Millisecond))
			la.Request.Host = "a"
			old := withFailures("a3", t0, t0.Add(3*time.Millisecond), 7)
			old.Request.Host = "a"
			insert(t, s, la,
				onRoute("a1", "a", t0, t0.Add(1*time.Millisecond)),
				onRoute("a2", "a", t0, t0.Add(2*time.Millisecond)),
				old,
				onRoute("b1", "b", t0, t0.Add(4*time.Millisecond)),
				onRoute("b2", "b", t0, t0.Add(5*time.Millisecond)),
				onRoute("c1", "c", t0, t0.Add(6*time.Millisecond)),
			)
			all := []string{"la", "a1", "a2", "a3", "b1", "b2", "c1"}
			before := map[string]*store.Record{}
			for _, id := range all {
				before[id] = get(t, s, id)
			}
			now := t0.Add(time.Second)
			var decided int
			recs := h.claimReq(t, s, store.ClaimRequest{
				Now: now, Limit: 10, Reserved: tc.reserved, Route: byHost, Room: tc.room,
				Decide: func(d *store.Delivery, lapsed bool) { decided++; Forward(d, lapsed) },
			})
			wantIDs(t, "claim", recs, tc.want...)
			if decided != len(recs) {
				t.Errorf("Decide ran %d times for %d records claimed: a skipped record was shown to it", decided, len(recs))
			}
			taken := map[string]bool{}
			for _, r := range recs {
				taken[r.ID] = true
				checkLeased(t, s, r, now, leaseLen)
			}
			var left []string
			for _, id := range all {
				if taken[id] {
					continue
				}
				left = append(left, id)
				if d := diffRecord(get(t, s, id), before[id]); d != "" {
					t.Errorf("skipped %s changed: %s", id, d)
				}
			}
			// Skipped records are claimable later, in their order.
			wantIDs(t, "claim after the limited one", h.claim(t, s, now, 10), left...)
		})
	}
}

// testClaimSkipBudget: skipping is bounded. Behind Limit+ClaimSkipBudget
// due records of a route without room, a record of an unlimited route is
// not found in that claim (each pass examines at most that many
// candidates); behind fewer, it is.
func testClaimSkipBudget(t *testing.T, h Harness) {
	const limit = 2
	tests := []struct {
		name  string
		ahead int
		found bool
	}{
		{"within the budget", store.ClaimSkipBudget / 2, true},
		{"beyond the budget", limit + store.ClaimSkipBudget, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := h.Open(t)
			t0 := base()
			insertAll(t, s, tc.ahead, func(i int) *store.Record {
				return onRoute(fmt.Sprintf("full%03d", i), "full", t0, t0.Add(time.Duration(i)*time.Millisecond))
			})
			insert(t, s, onRoute("free", "free", t0, t0.Add(time.Hour)))
			now := t0.Add(2 * time.Hour)
			recs := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: limit, Route: byHost, Room: map[string]int{"full": 0}})
			if tc.found {
				wantIDs(t, fmt.Sprintf("claim behind %d records without room", tc.ahead), recs, "free")
			} else {
				wantIDs(t, fmt.Sprintf("claim behind %d records without room", tc.ahead), recs)
			}
			if got := get(t, s, "full000"); got.State != store.StateQueued || got.Attempts != 0 {
				t.Errorf("a skipped record became %s with %d attempts", got.State, got.Attempts)
			}
			// Without the room limit, the oldest come first.
			wantIDs(t, "claim without room limits", h.claim(t, s, now, 1), "full000")
		})
	}
}
