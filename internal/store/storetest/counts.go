package storetest

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// checkCounts compares s.Counts with want (the suite provider's records by
// state) and, unless pending is negative, its pending tasks.
func checkCounts(s store.Store, want map[store.State]int64, pending int64) error {
	c, err := s.Counts(ctx)
	if err != nil {
		return fmt.Errorf("reading the counts: %v", err)
	}
	for st, n := range want {
		if n == 0 {
			delete(want, st)
		}
	}
	got := c.Records[prov]
	if len(got) != 0 || len(want) != 0 {
		if !maps.Equal(got, want) {
			return fmt.Errorf("Counts.Records[%s] = %v, want %v", prov, got, want)
		}
	}
	for p := range c.Records {
		if p != prov {
			return fmt.Errorf("Counts.Records has provider %q the suite never stored", p)
		}
	}
	if pending >= 0 && c.TasksPending[prov] != pending {
		return fmt.Errorf("Counts.TasksPending[%s] = %d, want %d", prov, c.TasksPending[prov], pending)
	}
	return nil
}

// testCounts checks that the counts follow inserts, duplicates, state
// changes, claims and expiry of records, and tasks added, completed by
// their result and expired by the poller.
func testCounts(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	step := func(what string, want map[store.State]int64, pending int64) {
		t.Helper()
		if err := checkCounts(s, want, pending); err != nil {
			t.Errorf("after %s: %v", what, err)
		}
	}
	step("nothing", nil, 0)
	for _, id := range []string{"t1", "t2", "t3"} {
		if _, err := s.AddTask(ctx, newTask(id, t0, t0.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	step("three tasks", nil, 3)
	insert(t, s, inState("t1", t0, store.StateForwarding), inState("q1", t0, store.StateQueued),
		inState("p1", t0, store.StateParked), inState("r1", t0, store.StateRejected))
	step("inserts", map[store.State]int64{store.StateForwarding: 1, store.StateQueued: 1, store.StateParked: 1, store.StateRejected: 1}, 2)
	if res, err := s.Insert(ctx, inState("q1", t0, store.StateParked)); err != nil || res.Existing == nil {
		t.Fatalf("duplicate insert: %+v, %v", res, err)
	}
	step("a duplicate", map[store.State]int64{store.StateForwarding: 1, store.StateQueued: 1, store.StateParked: 1, store.StateRejected: 1}, 2)
	update(t, s, "t1", func(d *store.Delivery) { d.State, d.Lease = store.StateDelivered, store.Lease{} })
	update(t, s, "p1", func(d *store.Delivery) { d.LastError = "still parked" })
	step("delivered, and an update within a state", map[store.State]int64{store.StateDelivered: 1, store.StateQueued: 1, store.StateParked: 1, store.StateRejected: 1}, 2)
	wantIDs(t, "claim", h.claim(t, s, t0, 10), "q1")
	step("a claim", map[store.State]int64{store.StateDelivered: 1, store.StateForwarding: 1, store.StateParked: 1, store.StateRejected: 1}, 2)
	if _, err := s.UpdateTask(ctx, key("t2"), func(tk *store.Task) error {
		tk.State, tk.NextPollAt = store.TaskExpired, time.Time{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	step("a task expired", map[store.State]int64{store.StateDelivered: 1, store.StateForwarding: 1, store.StateParked: 1, store.StateRejected: 1}, 1)
	update(t, s, "q1", func(d *store.Delivery) { d.State, d.Lease, d.DueAt = store.StateFailed, store.Lease{}, t0 })
	step("a failure", map[store.State]int64{store.StateDelivered: 1, store.StateFailed: 1, store.StateParked: 1, store.StateRejected: 1}, 1)
	// Retention: the undelivered ones are forgotten and counted out.
	gone, err := s.Expire(ctx, t0.Add(retention+time.Second), 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 3 {
		t.Errorf("Expire forgot %v, want the 3 undelivered", gone)
	}
	want := map[store.State]int64{}
	if _, err := s.Get(ctx, key("t1")); err == nil {
		want[store.StateDelivered] = 1 // a store may forget a delivered record later
	}
	step("expiry", want, -1) // a pending task past its own retention may go with it
}

// testListTasks checks ListTaskPage's filters, order and limit on
// tasks submitted at one time (ordered by provider, then id).
func testListTasks(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	for _, id := range []string{"c", "a", "b", "d"} {
		if _, err := s.AddTask(ctx, newTask(id, t0, t0.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	other := newTask("z", t0, t0)
	other.Provider = "capsolver"
	if _, err := s.AddTask(ctx, other); err != nil {
		t.Fatal(err)
	}
	insert(t, s, inState("b", t0, store.StateDelivered))
	if _, err := s.UpdateTask(ctx, key("d"), func(tk *store.Task) error {
		tk.State, tk.NextPollAt = store.TaskExpired, time.Time{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		provider string
		state    store.TaskState
		limit    int
		want     []string
	}{
		{"", "", 10, []string{"a", "b", "c", "d", "z"}},
		{prov, "", 10, []string{"a", "b", "c", "d"}},
		{prov, store.TaskPending, 10, []string{"a", "c"}},
		{prov, store.TaskDone, 10, []string{"b"}},
		{"", store.TaskExpired, 10, []string{"d"}},
		{prov, "", 2, []string{"a", "b"}},
		{"capsolver", "", 10, []string{"z"}},
		{"nobody", "", 10, nil},
	} {
		page, err := s.ListTaskPage(ctx, store.TaskQuery{Provider: tc.provider, State: tc.state, Limit: tc.limit})
		if err != nil {
			t.Fatalf("ListTaskPage(%q, %q, %d): %v", tc.provider, tc.state, tc.limit, err)
		}
		if ids := taskIDs(page.Tasks); !slices.Equal(ids, tc.want) {
			t.Errorf("ListTaskPage(%q, %q, %d) = %v, want %v", tc.provider, tc.state, tc.limit, ids, tc.want)
		}
	}
}
