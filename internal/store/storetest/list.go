package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// prov2 is the second provider of the listing tests.
const prov2 = "rucaptcha"

// listFixture stores 60 records of two providers in every state, received
// over 30 seconds with two records in each second (so that ties are broken
// by key), and returns them as stored.
func listFixture(t *testing.T, s store.Store, t0 time.Time) []*store.Record {
	t.Helper()
	var all []*store.Record
	for i := range 60 {
		st := store.States[i%len(store.States)]
		r := inState(fmt.Sprintf("L%02d", 59-i), t0.Add(time.Duration(i/2)*time.Second), st)
		if i%3 == 0 {
			r.Provider = prov2
		}
		insert(t, s, r)
		all = append(all, r)
	}
	return all
}

// pageThrough lists every page of q and returns the records in the order
// given, checking that every page but the last is full and carries Next.
func pageThrough(t *testing.T, s store.Store, q store.ListQuery) []*store.Record {
	t.Helper()
	var out []*store.Record
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatalf("ListPage(%+v): more than 100 pages", q)
		}
		p, err := s.ListPage(ctx, q)
		if err != nil {
			t.Fatalf("ListPage(%+v): %v", q, err)
		}
		out = append(out, p.Records...)
		if p.Next == nil {
			return out
		}
		if len(p.Records) != q.Limit {
			t.Fatalf("ListPage(%+v): %d records and a Next, want a full page of %d", q, len(p.Records), q.Limit)
		}
		if got := store.PositionOf(p.Records[len(p.Records)-1]); store.ComparePosition(got, *p.Next) != 0 {
			t.Fatalf("ListPage: Next %+v is not the last record's position %+v", *p.Next, got)
		}
		q.After = p.Next
	}
}

// taskPageThrough lists every page of q and returns its tasks as
// provider/id in the order given. The error says how the pages broke
// ListTaskPage's contract: a page but the last that is not full or whose
// Next is not its last task's position, more than 100 pages, or
// ListTaskPage's own error.
func taskPageThrough(s store.Store, q store.TaskQuery) ([]string, error) {
	var out []string
	for pages := 0; ; pages++ {
		if pages > 100 {
			return nil, fmt.Errorf("ListTaskPage(%+v): more than 100 pages", q)
		}
		p, err := s.ListTaskPage(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("ListTaskPage(%+v): %w", q, err)
		}
		for _, tk := range p.Tasks {
			out = append(out, tk.Provider+"/"+tk.ID)
		}
		if p.Next == nil {
			return out, nil
		}
		if len(p.Tasks) != q.Limit {
			return nil, fmt.Errorf("ListTaskPage(%+v): %d tasks and a Next", q, len(p.Tasks))
		}
		if last := store.TaskPositionOf(p.Tasks[len(p.Tasks)-1]); store.CompareTaskPosition(*p.Next, last) != 0 {
			return nil, fmt.Errorf("ListTaskPage(%+v): Next %+v, want the last task's %+v", q, *p.Next, last)
		}
		q.After = p.Next
	}
}

// keyIDs is provider:id of each record.
func keyIDs(recs []*store.Record) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Key().String()
	}
	return out
}

// testListPage checks ListPage's order (received time, then key), its
// filters alone and together, and its pages, over more records than one
// page holds.
func testListPage(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	all := listFixture(t, s, t0)
	sorted := slices.Clone(all)
	slices.SortFunc(sorted, func(a, b *store.Record) int { return store.ComparePosition(store.PositionOf(a), store.PositionOf(b)) })
	after, before := t0.Add(5*time.Second), t0.Add(20*time.Second)
	tests := []struct {
		name string
		q    store.ListQuery
		keep func(r *store.Record) bool
	}{
		{"all", store.ListQuery{}, func(*store.Record) bool { return true }},
		{"provider", store.ListQuery{Provider: prov2}, func(r *store.Record) bool { return r.Provider == prov2 }},
		{"delivered", store.ListQuery{State: store.StateDelivered}, func(r *store.Record) bool { return r.State == store.StateDelivered }},
		{"parked", store.ListQuery{State: store.StateParked}, func(r *store.Record) bool { return r.State == store.StateParked }},
		{"forwarding", store.ListQuery{State: store.StateForwarding}, func(r *store.Record) bool { return r.State == store.StateForwarding }},
		{"failed of one provider", store.ListQuery{Provider: prov, State: store.StateFailed}, func(r *store.Record) bool {
			return r.Provider == prov && r.State == store.StateFailed
		}},
		{"received after", store.ListQuery{ReceivedAfter: after}, func(r *store.Record) bool { return !r.ReceivedAt.Before(after) }},
		{"received before", store.ListQuery{ReceivedBefore: before}, func(r *store.Record) bool { return r.ReceivedAt.Before(before) }},
		{"range, provider and state", store.ListQuery{Provider: prov, State: store.StateQueued, ReceivedAfter: after, ReceivedBefore: before},
			func(r *store.Record) bool {
				return r.Provider == prov && r.State == store.StateQueued && !r.ReceivedAt.Before(after) && r.ReceivedAt.Before(before)
			}},
		{"empty range", store.ListQuery{ReceivedAfter: before, ReceivedBefore: after}, func(*store.Record) bool { return false }},
	}
	for _, tc := range tests {
		var want []*store.Record
		for _, r := range sorted {
			if tc.keep(r) {
				want = append(want, r)
			}
		}
		for _, limit := range []int{1, 4, 10, 1000} {
			q := tc.q
			q.Limit = limit
			got := pageThrough(t, s, q)
			if !slices.Equal(keyIDs(got), keyIDs(want)) {
				t.Errorf("%s, limit %d: got %v, want %v", tc.name, limit, keyIDs(got), keyIDs(want))
				continue
			}
			for i, r := range got {
				w := cloneRecord(want[i])
				w.Lease.Owner = r.Lease.Owner // the store's
				if d := diffRecord(r, w); d != "" {
					t.Errorf("%s: record %s: %s", tc.name, r.Key(), d)
				}
			}
		}
	}
	if len(sorted) < 20 {
		t.Fatalf("fixture of %d records", len(sorted))
	}
	// A cursor taken from a record in the middle starts right after it.
	mid := store.PositionOf(sorted[17])
	p, err := s.ListPage(ctx, store.ListQuery{After: &mid, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keyIDs(p.Records), keyIDs(sorted[18:21]); !slices.Equal(got, want) {
		t.Errorf("page after %v: got %v, want %v", mid, got, want)
	}
	// The state of a record that changes moves it between the filtered
	// lists.
	r := sorted[0]
	if r.State != store.StateQueued && r.State != store.StateFailed {
		for _, c := range sorted {
			if c.State == store.StateParked {
				r = c
				break
			}
		}
	}
	if _, err := s.UpdateDelivery(ctx, r.Key(), func(d *store.Delivery) error {
		*d = store.Delivery{State: store.StateDelivered, Attempts: d.Attempts + 1, UpdatedAt: t0}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, st := range []store.State{r.State, store.StateDelivered} {
		got := pageThrough(t, s, store.ListQuery{State: st, Limit: 3})
		in := slices.Contains(keyIDs(got), r.Key().String())
		if in != (st == store.StateDelivered) {
			t.Errorf("after %s was delivered: in the %s list: %v", r.Key(), st, in)
		}
	}
	if _, err := s.ListPage(ctx, store.ListQuery{Limit: 0}); err == nil {
		t.Error("ListPage with limit 0: no error")
	}
}

// testListTaskPage checks ListTaskPage's order (submission time, then
// provider, then id) and its pages with each filter, over more tasks than
// a page: a state change moves a task between the filtered lists, and a
// purged task is listed no more.
func testListTaskPage(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	states := []store.TaskState{store.TaskPending, store.TaskDone, store.TaskExpired}
	var all []*store.Task
	for i := range 60 {
		// Two tasks a second, ids against the time order, so that
		// neither the key order nor the insertion order is the answer.
		tk := newTask(fmt.Sprintf("T%02d", 59-i), t0.Add(time.Duration(i/2)*time.Second), t0.Add(time.Hour))
		if i%3 == 0 {
			tk.Provider = prov2
		}
		all = append(all, addInState(t, s, tk, states[i%len(states)]))
	}
	sortTasks(all)
	check := func(when string) {
		t.Helper()
		queries := []store.TaskQuery{{}, {Provider: prov}, {Provider: prov2}, {Provider: "nobody"}}
		for _, st := range states {
			queries = append(queries, store.TaskQuery{State: st}, store.TaskQuery{Provider: prov2, State: st})
		}
		for _, q := range queries {
			var want []string
			for _, tk := range all {
				if (q.Provider == "" || tk.Provider == q.Provider) && (q.State == "" || tk.State == q.State) {
					want = append(want, tk.Provider+"/"+tk.ID)
				}
			}
			for _, limit := range []int{1, 7, 25, 1000} {
				q := q
				q.Limit = limit
				got, err := taskPageThrough(s, q)
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: ListTaskPage(%+v):\n got %v\nwant %v", when, q, got, want)
				}
			}
		}
	}
	check("stored")

	// A cursor from the middle: the page starts after it.
	mid := store.TaskPositionOf(all[29])
	p, err := s.ListTaskPage(ctx, store.TaskQuery{After: &mid, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := taskIDs(p.Tasks); !slices.Equal(got, []string{all[30].ID, all[31].ID, all[32].ID}) {
		t.Errorf("ListTaskPage after the 30th: %v", got)
	}

	// A pending task becomes done (UpdateTask) and another one by its
	// result (Insert): both move from the pending list to the done one.
	var moved []*store.Task
	for _, tk := range all {
		if tk.State == store.TaskPending && len(moved) < 2 {
			moved = append(moved, tk)
		}
	}
	if _, err := s.UpdateTask(ctx, moved[0].Key(), func(tk *store.Task) error {
		tk.State, tk.NextPollAt = store.TaskDone, time.Time{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	moved[0].State = store.TaskDone
	r := inState(moved[1].ID, moved[1].SubmittedAt.Add(time.Second), store.StateDelivered)
	r.Provider = moved[1].Provider
	insert(t, s, r)
	moved[1].State = store.TaskDone
	check("after two tasks were done")

	// Purging the result purges its task, which leaves every list.
	if n, err := s.Purge(ctx, store.PurgeQuery{Keys: []store.Key{r.Key()}}); err != nil || n != 1 {
		t.Fatalf("Purge: %d, %v", n, err)
	}
	all = slices.DeleteFunc(all, func(tk *store.Task) bool { return tk.Key() == r.Key() })
	check("after a purge")

	if _, err := s.ListTaskPage(ctx, store.TaskQuery{Limit: 0}); err == nil {
		t.Error("ListTaskPage with limit 0: no error")
	}
}

// testPurge checks Purge by key and by filter: the record, its task and
// its counts go; the tombstone makes a re-sent result a duplicate and Get
// answer ErrPurged, across a restart; a forward in flight finds nothing to
// record; records of other keys and states stay.
func testPurge(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	insert(t, s, inState("P1", t0, store.StateParked), inState("P2", t0.Add(time.Second), store.StateParked),
		inState("D1", t0, store.StateDelivered), inState("F1", t0, store.StateForwarding), inState("P10", t0, store.StateParked))
	tk := newTask("P1", t0, t0.Add(time.Minute))
	if _, err := s.AddTask(ctx, tk); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddTask(ctx, newTask("T9", t0, t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if err := checkCounts(s, map[store.State]int64{store.StateParked: 3, store.StateDelivered: 1, store.StateForwarding: 1}, 1); err != nil {
		t.Fatal(err)
	}
	purge := func(q store.PurgeQuery, want int) {
		t.Helper()
		n, err := s.Purge(ctx, q)
		if err != nil || n != want {
			t.Fatalf("Purge(%+v) = %d, %v; want %d", q, n, err, want)
		}
	}
	if _, err := s.Purge(ctx, store.PurgeQuery{}); err == nil {
		t.Error("Purge with no keys and no filter: no error")
	}
	purge(store.PurgeQuery{Keys: []store.Key{key("P1")}}, 1)
	purge(store.PurgeQuery{Keys: []store.Key{key("P1"), key("nothing")}}, 0)
	wantPurged := func(s store.Store, id string) {
		t.Helper()
		if r, err := s.Get(ctx, key(id)); !errors.Is(err, store.ErrPurged) || !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(%s) after purge = %+v, %v; want ErrPurged (an ErrNotFound)", id, r, err)
		}
	}
	wantPurged(s, "P1")
	get(t, s, "P10") // a key that P1 is a prefix of stays
	if tk, err := s.GetTask(ctx, key("P1")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetTask(P1) after purge = %+v, %v; want ErrNotFound", tk, err)
	}
	if err := checkCounts(s, map[store.State]int64{store.StateParked: 2, store.StateDelivered: 1, store.StateForwarding: 1}, 1); err != nil {
		t.Error(err)
	}
	resend := func(s store.Store, id string) {
		t.Helper()
		res, err := s.Insert(ctx, inState(id, t0.Add(time.Hour), store.StateForwarding))
		if err != nil || res.Existing == nil || !res.Purged {
			t.Errorf("Insert(%s) after purge = %+v, %v; want a duplicate with Purged", id, res, err)
		}
		wantPurged(s, id)
	}
	resend(s, "P1")

	// A forward in flight: purged; its end finds nothing, and the retry
	// backlog's age (F1 was all of it) goes with it.
	backlog := func() time.Time {
		t.Helper()
		a, err := s.Ages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return a.OldestUndelivered[prov]
	}
	if backlog().IsZero() {
		t.Error("Ages.OldestUndelivered is zero with a forward in flight")
	}
	purge(store.PurgeQuery{Keys: []store.Key{key("F1")}}, 1)
	if at := backlog(); !at.IsZero() {
		t.Errorf("Ages.OldestUndelivered = %v after the purge of the only forward, want none", at)
	}
	if _, err := s.UpdateDelivery(ctx, key("F1"), func(d *store.Delivery) error {
		d.State = store.StateDelivered
		return nil
	}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateDelivery of a purged forward: %v, want ErrNotFound", err)
	}
	if err := s.Renew(ctx, key("F1"), 1, t0.Add(time.Hour)); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew of a purged forward: %v, want ErrLeaseLost", err)
	}
	if recs := h.claimKeys(t, s, t0.Add(time.Hour), "F1"); len(recs) != 0 {
		t.Errorf("Claim of a purged record: %v", ids(recs))
	}
	wantPurged(s, "F1")

	// By filter: the parked ones only.
	purge(store.PurgeQuery{State: store.StateParked, ReceivedBefore: t0.Add(time.Second)}, 1)
	wantPurged(s, "P10")
	get(t, s, "P2")
	purge(store.PurgeQuery{State: store.StateParked}, 1)
	wantPurged(s, "P2")
	get(t, s, "D1")
	purge(store.PurgeQuery{Provider: prov2}, 0)
	if err := checkCounts(s, map[store.State]int64{store.StateDelivered: 1}, 1); err != nil {
		t.Error(err)
	}
	p, err := s.ListPage(ctx, store.ListQuery{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "listed after the purges", p.Records, "D1")
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		resend(s, "P2")
		if err := checkCounts(s, map[store.State]int64{store.StateDelivered: 1}, 1); err != nil {
			t.Error(err)
		}
	}
}
