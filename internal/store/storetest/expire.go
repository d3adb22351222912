package storetest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// expire runs Expire and returns what it reported, key id → state.
func expire(t *testing.T, s store.Store, now time.Time, limit int) map[string]store.State {
	t.Helper()
	gone, err := s.Expire(ctx, now, limit)
	if err != nil {
		t.Fatalf("Expire(%s, %d): %v", fmtTime(now), limit, err)
	}
	out := map[string]store.State{}
	for _, e := range gone {
		if e.Key.Provider != prov {
			t.Errorf("Expire reported a record of provider %q", e.Key.Provider)
		}
		if _, dup := out[e.Key.ID]; dup {
			t.Errorf("Expire reported %s twice", e.Key.ID)
		}
		out[e.Key.ID] = e.State
	}
	return out
}

func wantExpired(t *testing.T, what string, got map[string]store.State, want map[string]store.State) {
	t.Helper()
	if !maps.Equal(got, want) {
		t.Errorf("%s: Expire reported %v, want %v", what, got, want)
	}
}

func testExpire(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	end := t0.Add(2 * time.Hour) // the retention's end
	rec := func(id string, st store.State, expires time.Time) *store.Record {
		r := inState(id, t0, st)
		if st == store.StateQueued || st == store.StateFailed {
			r.DueAt = t0.Add(24 * time.Hour) // never claimed in this test
		}
		r.ExpiresAt = expires
		return r
	}
	insert(t, s,
		rec("failed", store.StateFailed, end),
		rec("parked", store.StateParked, end),
		rec("rejected", store.StateRejected, end),
		rec("queued", store.StateQueued, end),
		rec("delivered", store.StateDelivered, end),
		rec("retried", store.StateFailed, end), // delivered later, before its end
		rec("later", store.StateFailed, end.Add(time.Hour)),
		rec("subsecond", store.StateQueued, end.Add(500*time.Millisecond)),
	)
	update(t, s, "retried", func(d *store.Delivery) {
		d.State, d.DueAt, d.Attempts, d.LastStatus, d.LastError = store.StateDelivered, time.Time{}, 2, 200, ""
	})

	wantExpired(t, "a second before the end", expire(t, s, end.Add(-time.Second), 100), map[string]store.State{})
	wantExpired(t, "a nanosecond before the end", expire(t, s, end.Add(-time.Nanosecond), 100), map[string]store.State{})
	for _, id := range []string{"failed", "parked", "rejected", "queued", "subsecond", "later"} {
		get(t, s, id)
	}

	wantExpired(t, "at the end", expire(t, s, end, 100), map[string]store.State{
		"failed": store.StateFailed, "parked": store.StateParked, "rejected": store.StateRejected, "queued": store.StateQueued,
	})
	for _, id := range []string{"failed", "parked", "rejected", "queued"} {
		wantNotFound(t, s, id)
	}
	wantIDs(t, "claim by key of an expired record", h.claimKeys(t, s, end, "queued", "failed"))
	if recs, err := s.List(ctx, store.Filter{State: store.StateParked}, 10); err != nil || len(recs) != 0 {
		t.Errorf("List(parked) after Expire = %v, %v; want none", ids(recs), err)
	}
	for _, id := range []string{"subsecond", "later"} {
		get(t, s, id)
	}
	wantExpired(t, "at the end again", expire(t, s, end, 100), map[string]store.State{})

	// Retention ends at ExpiresAt to the nanosecond, not at its second.
	wantExpired(t, "within the second of a retention's end", expire(t, s, end.Add(250*time.Millisecond), 100), map[string]store.State{})
	get(t, s, "subsecond")
	wantExpired(t, "at a sub-second end", expire(t, s, end.Add(500*time.Millisecond), 100), map[string]store.State{"subsecond": store.StateQueued})
	wantNotFound(t, s, "subsecond")

	wantExpired(t, "at the later end", expire(t, s, end.Add(time.Hour), 100), map[string]store.State{"later": store.StateFailed})
	wantNotFound(t, s, "later")
	wantExpired(t, "after every end", expire(t, s, end.Add(2*time.Hour), 100), map[string]store.State{})
}

func testExpireLimit(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	end := t0.Add(time.Hour)
	for i := range 5 {
		r := inState(fmt.Sprint(i), t0, store.StateParked)
		r.ExpiresAt = end.Add(-time.Duration(i) * time.Second)
		insert(t, s, r)
	}
	all := map[string]store.State{}
	for i, want := range []int{2, 2, 1, 0} {
		got := expire(t, s, end, 2)
		if len(got) != want {
			t.Errorf("Expire call %d with limit 2: %v, want %d records", i+1, got, want)
		}
		for id, st := range got {
			if _, dup := all[id]; dup {
				t.Errorf("%s reported by two Expire calls", id)
			}
			all[id] = st
		}
	}
	if ks := slices.Sorted(maps.Keys(all)); !slices.Equal(ks, []string{"0", "1", "2", "3", "4"}) {
		t.Errorf("Expire reported %v in all, want [0 1 2 3 4]", ks)
	}
}

func testTasks(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	task := newTask("1", t0, t0.Add(30*time.Second))
	task.Polls, task.LastError = 1, "CAPCHA_NOT_READY"
	arg := *task
	if ex, err := s.AddTask(ctx, task); err != nil || ex != nil {
		t.Fatalf("AddTask of a new task = %+v, %v; want no existing task", ex, err)
	}
	if *task != arg {
		t.Errorf("AddTask changed its argument")
	}
	got, err := s.GetTask(ctx, key("1"))
	if err != nil {
		t.Fatal(err)
	}
	if d := diffTask(got, task); d != "" {
		t.Errorf("GetTask after AddTask: %s", d)
	}
	other := newTask("1", t0.Add(time.Second), t0)
	other.Method = "post"
	ex, err := s.AddTask(ctx, other)
	if err != nil || ex == nil {
		t.Fatalf("AddTask of a known key = %+v, %v; want the existing task", ex, err)
	}
	if d := diffTask(ex, task); d != "" {
		t.Errorf("AddTask of a known key returned %s", d)
	}
	if got, _ := s.GetTask(ctx, key("1")); got == nil || diffTask(got, task) != "" {
		t.Errorf("AddTask of a known key overwrote the task: %+v", got)
	}
	if _, err := s.GetTask(ctx, key("404")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetTask of an unknown key: %v, want ErrNotFound", err)
	}

	// A task whose result is already stored is stored done.
	r2 := inState("2", t0, store.StateDelivered)
	insert(t, s, r2)
	if ex, err := s.AddTask(ctx, newTask("2", t0, t0)); err != nil || ex != nil {
		t.Fatalf("AddTask after its result = %+v, %v", ex, err)
	}
	if got, err := s.GetTask(ctx, key("2")); err != nil || got.State != store.TaskDone || !got.NextPollAt.IsZero() || !got.ResultAt.Equal(r2.ReceivedAt) {
		t.Errorf("task added after its result = %+v, %v; want done, never polled, ResultAt the result's ReceivedAt", got, err)
	}

	// UpdateTask.
	next := t0.Add(time.Minute)
	up, err := s.UpdateTask(ctx, key("1"), func(tk *store.Task) error {
		tk.Polls, tk.NextPollAt, tk.LastError, tk.UpdatedAt = 2, next, "", t0.Add(30*time.Second)
		return nil
	})
	if err != nil {
		t.Fatalf("UpdateTask: %v", err)
	}
	want := *task
	want.Polls, want.NextPollAt, want.LastError, want.UpdatedAt = 2, next, "", t0.Add(30*time.Second)
	if d := diffTask(up, &want); d != "" {
		t.Errorf("UpdateTask returned %s", d)
	}
	if got, _ := s.GetTask(ctx, key("1")); got == nil || diffTask(got, &want) != "" {
		t.Errorf("GetTask after UpdateTask = %+v", got)
	}
	fnErr := errors.New("not now")
	up, err = s.UpdateTask(ctx, key("1"), func(tk *store.Task) error {
		tk.State, tk.NextPollAt = store.TaskExpired, time.Time{}
		return fnErr
	})
	if !errors.Is(err, fnErr) {
		t.Errorf("UpdateTask with a failing fn: %v, want its error", err)
	}
	if up == nil || diffTask(up, &want) != "" {
		t.Errorf("UpdateTask with a failing fn returned %+v, want the unchanged task", up)
	}
	if got := dueTaskIDs(t, s, next, 10); !slices.Equal(got, []string{"1"}) {
		t.Errorf("DueTasks after a failed UpdateTask = %v, want [1]", got)
	}
	if _, err := s.UpdateTask(ctx, key("404"), func(*store.Task) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateTask of an unknown key: %v, want ErrNotFound", err)
	}
}

func testDueTasks(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	at := func(d time.Duration) time.Time { return t0.Add(d * time.Second) }
	for _, x := range []struct {
		id   string
		next time.Time
	}{{"a", at(3)}, {"b", at(1)}, {"c", at(2)}, {"d", at(10)}, {"never", time.Time{}}} {
		if _, err := s.AddTask(ctx, newTask(x.id, t0, x.next)); err != nil {
			t.Fatal(err)
		}
	}
	check := func(now time.Time, limit int, want ...string) {
		t.Helper()
		if got := dueTaskIDs(t, s, now, limit); !slices.Equal(got, want) {
			t.Errorf("DueTasks(t0%+ds, %d) = %v, want %v", int(now.Sub(t0)/time.Second), limit, got, want)
		}
	}
	check(t0, 10)
	check(at(1), 10, "b") // at NextPollAt: due
	check(at(3), 10, "b", "c", "a")
	check(at(3), 2, "b", "c")
	check(at(3600), 10, "b", "c", "a", "d")
	tasks, err := s.DueTasks(ctx, store.DueQuery{Now: at(1), Limit: 10, Accounts: anyAccount})
	if err != nil || len(tasks) != 1 || diffTask(tasks[0], newTask("b", t0, at(1))) != "" {
		t.Errorf("DueTasks returned %+v, %v; want task b as stored", tasks, err)
	}

	upd := func(id string, fn func(tk *store.Task)) {
		t.Helper()
		if _, err := s.UpdateTask(ctx, key(id), func(tk *store.Task) error { fn(tk); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	upd("b", func(tk *store.Task) { tk.NextPollAt = at(5) })
	check(at(3), 10, "c", "a")
	check(at(5), 10, "c", "a", "b")
	upd("c", func(tk *store.Task) { tk.State, tk.NextPollAt = store.TaskExpired, time.Time{} })
	check(at(5), 10, "a", "b")
	// Only pending tasks are due, even if a poll time was left behind.
	upd("a", func(tk *store.Task) { tk.State = store.TaskDone })
	check(at(5), 10, "b")
	// A result completes its task.
	insert(t, s, inState("d", t0, store.StateDelivered))
	check(at(3600), 10, "b")
}
