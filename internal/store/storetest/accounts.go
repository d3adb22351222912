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

// The suite's account ids: two accounts of prov, one of prov2.
const (
	acctA = "00000000000000aa"
	acctB = "00000000000000bb"
	acctC = "00000000000000cc"
)

// accountTask is newTask of provider p with account acct.
func accountTask(p, acct, id string, t0, next time.Time) *store.Task {
	tk := newTask(id, t0, next)
	tk.Provider, tk.Account = p, acct
	return tk
}

// testTaskAccount: a task's account is kept by AddTask, GetTask,
// UpdateTask (which may change it), DueTasks and ListTaskPage, and an
// account id with '/' is refused with nothing written.
func testTaskAccount(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	tk := accountTask(prov, acctA, "1", t0, t0)
	if ex, err := s.AddTask(ctx, tk); err != nil || ex != nil {
		t.Fatalf("AddTask: %+v, %v", ex, err)
	}
	if got, err := s.GetTask(ctx, tk.Key()); err != nil || diffTask(got, tk) != "" {
		t.Errorf("GetTask = %+v, %v; want the task with account %s", got, err, acctA)
	}
	// A task under the same key with another account: the stored one is
	// kept and returned.
	if ex, err := s.AddTask(ctx, accountTask(prov, acctB, "1", t0, t0)); err != nil || ex == nil || ex.Account != acctA {
		t.Errorf("AddTask of the key again = %+v, %v; want the existing task of %s", ex, err, acctA)
	}
	due, err := s.DueTasks(ctx, store.DueQuery{Now: t0, Limit: 10, Accounts: []store.Account{{Provider: prov, ID: acctA}}})
	if err != nil || len(due) != 1 || diffTask(due[0], tk) != "" {
		t.Errorf("DueTasks = %+v, %v; want the task as stored", due, err)
	}
	page, err := s.ListTaskPage(ctx, store.TaskQuery{Limit: 10})
	if err != nil || len(page.Tasks) != 1 || diffTask(page.Tasks[0], tk) != "" {
		t.Errorf("ListTaskPage = %+v, %v; want the task as stored", page.Tasks, err)
	}

	up, err := s.UpdateTask(ctx, tk.Key(), func(x *store.Task) error { x.Account = acctB; return nil })
	want := *tk
	want.Account = acctB
	if err != nil || diffTask(up, &want) != "" {
		t.Errorf("UpdateTask to account %s = %+v, %v", acctB, up, err)
	}
	if got, err := s.GetTask(ctx, tk.Key()); err != nil || diffTask(got, &want) != "" {
		t.Errorf("GetTask after the account changed = %+v, %v; want account %s", got, err, acctB)
	}

	// '/' cannot be in an account id: refused, nothing written.
	bad := accountTask(prov, "a/b", "2", t0, t0)
	if _, err := s.AddTask(ctx, bad); err == nil {
		t.Error("AddTask of an account id with '/' succeeded")
	}
	if _, err := s.GetTask(ctx, bad.Key()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("GetTask of the refused task: %v, want ErrNotFound", err)
	}
	up, err = s.UpdateTask(ctx, tk.Key(), func(x *store.Task) error { x.Account, x.Polls = "x/y", 7; return nil })
	if err == nil {
		t.Error("UpdateTask to an account id with '/' succeeded")
	}
	if up == nil || diffTask(up, &want) != "" {
		t.Errorf("the refused UpdateTask returned %+v, want the unchanged task", up)
	}
	if got, err := s.GetTask(ctx, tk.Key()); err != nil || diffTask(got, &want) != "" {
		t.Errorf("GetTask after the refused UpdateTask = %+v, %v; want it unchanged", got, err)
	}
}

// testDueTasksAccounts: DueTasks answers the due tasks of the accounts
// asked for only, merged in NextPollAt order; none asked, none answered;
// and a task that changes account moves with it.
func testDueTasksAccounts(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	at := func(d int) time.Time { return t0.Add(time.Duration(d) * time.Second) }
	for _, x := range []struct {
		p, acct, id string
		next        int
	}{
		{prov, acctA, "a1", 1}, {prov, acctA, "a4", 4}, {prov, acctA, "a9", 900},
		{prov, acctB, "b2", 2}, {prov, acctB, "b5", 5},
		{prov, "", "n3", 3},
		{prov2, acctC, "c1", 1}, {prov2, "", "m6", 6},
	} {
		if _, err := s.AddTask(ctx, accountTask(x.p, x.acct, x.id, t0, at(x.next))); err != nil {
			t.Fatal(err)
		}
	}
	a, b, none := store.Account{Provider: prov, ID: acctA}, store.Account{Provider: prov, ID: acctB}, store.Account{Provider: prov}
	c, none2 := store.Account{Provider: prov2, ID: acctC}, store.Account{Provider: prov2}
	check := func(now, limit int, accts []store.Account, want ...string) {
		t.Helper()
		ts, err := s.DueTasks(ctx, store.DueQuery{Now: at(now), Limit: limit, Accounts: accts})
		if err != nil {
			t.Fatalf("DueTasks(t0+%ds, %d, %v): %v", now, limit, accts, err)
		}
		if got := taskIDs(ts); !slices.Equal(got, want) {
			t.Errorf("DueTasks(t0+%ds, %d, %v) = %v, want %v", now, limit, accts, got, want)
		}
	}
	check(10, 100, nil)
	check(10, 100, []store.Account{a}, "a1", "a4")
	check(10, 100, []store.Account{b}, "b2", "b5")
	check(10, 100, []store.Account{none}, "n3")
	check(10, 100, []store.Account{a, b}, "a1", "b2", "a4", "b5")
	check(10, 100, []store.Account{b, a, b, a}, "a1", "b2", "a4", "b5") // a repeat counts once
	check(10, 3, []store.Account{a, b, none}, "a1", "b2", "n3")
	check(4, 100, []store.Account{a, b, none}, "a1", "b2", "n3", "a4")
	// Ties in time go by provider, then id.
	check(1, 100, []store.Account{c, a}, "a1", "c1")
	check(10, 100, []store.Account{none2, c}, "c1", "m6")
	check(10, 100, []store.Account{{Provider: prov2, ID: acctA}, {Provider: "nobody"}})
	check(1000, 100, []store.Account{a, c}, "a1", "c1", "a4", "a9")

	// A task moved to another account is due there, not where it was.
	if _, err := s.UpdateTask(ctx, key("a4"), func(tk *store.Task) error { tk.Account = acctB; return nil }); err != nil {
		t.Fatal(err)
	}
	check(10, 100, []store.Account{a}, "a1")
	check(10, 100, []store.Account{b}, "b2", "a4", "b5")
	// Done and expired tasks are never due, whatever their account.
	if _, err := s.UpdateTask(ctx, key("b2"), func(tk *store.Task) error { tk.State = store.TaskDone; return nil }); err != nil {
		t.Fatal(err)
	}
	check(10, 100, []store.Account{a, b}, "a1", "a4", "b5")

	if _, err := s.DueTasks(ctx, store.DueQuery{Now: at(10), Limit: 0, Accounts: []store.Account{a}}); err == nil {
		t.Error("DueTasks with limit 0 succeeded")
	}
}

// testListTaskPageAccount: ListTaskPage's account filter, alone and with
// a provider and a state, page after page.
func testListTaskPageAccount(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	states := []store.TaskState{store.TaskPending, store.TaskDone, store.TaskExpired}
	accts := []struct{ p, id string }{{prov, acctA}, {prov, acctB}, {prov, ""}, {prov2, acctC}}
	var all []*store.Task
	for i := range 48 {
		ac := accts[i%len(accts)]
		tk := accountTask(ac.p, ac.id, fmt.Sprintf("T%02d", 47-i), t0.Add(time.Duration(i/3)*time.Second), t0.Add(time.Hour))
		all = append(all, addInState(t, s, tk, states[(i/4)%len(states)]))
	}
	sortTasks(all)
	var queries []store.TaskQuery
	for _, acct := range []string{acctA, acctB, acctC, "0000000000000404"} {
		queries = append(queries, store.TaskQuery{Account: acct}, store.TaskQuery{Account: acct, Provider: prov},
			store.TaskQuery{Account: acct, Provider: prov2})
		for _, st := range states {
			queries = append(queries, store.TaskQuery{Account: acct, State: st}, store.TaskQuery{Account: acct, Provider: prov, State: st})
		}
	}
	for _, q := range queries {
		var want []string
		for _, tk := range all {
			if tk.Account == q.Account && (q.Provider == "" || tk.Provider == q.Provider) && (q.State == "" || tk.State == q.State) {
				want = append(want, tk.Provider+"/"+tk.ID)
			}
		}
		for _, limit := range []int{1, 5, 100} {
			q := q
			q.Limit = limit
			got, err := taskPageThrough(s, q)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("ListTaskPage(%+v):\n got %v\nwant %v", q, got, want)
			}
		}
	}
	// No account filter: every account's tasks.
	p, err := s.ListTaskPage(ctx, store.TaskQuery{Provider: prov, State: store.TaskPending, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tk := range all {
		if tk.Provider == prov && tk.State == store.TaskPending {
			n++
		}
	}
	if len(p.Tasks) != n {
		t.Errorf("ListTaskPage(%s, pending) without account: %d tasks, want %d", prov, len(p.Tasks), n)
	}
}

// checkAccountCounts compares Counts' pending tasks by account with want
// (provider → account → count), and their sums with TasksPending.
func checkAccountCounts(s store.Store, want map[string]map[string]int64) error {
	c, err := s.Counts(ctx)
	if err != nil {
		return fmt.Errorf("reading the counts: %v", err)
	}
	if c.TasksPendingByAccount == nil {
		return errors.New("Counts.TasksPendingByAccount is nil")
	}
	if !maps.EqualFunc(c.TasksPendingByAccount, want, maps.Equal) {
		return fmt.Errorf("Counts.TasksPendingByAccount = %v, want %v", c.TasksPendingByAccount, want)
	}
	sums := map[string]int64{}
	for p, m := range want {
		for _, n := range m {
			sums[p] += n
		}
	}
	if !maps.Equal(c.TasksPending, sums) {
		return fmt.Errorf("Counts.TasksPending = %v, want %v", c.TasksPending, sums)
	}
	return nil
}

// testCountsByAccount: the pending tasks by account follow tasks added,
// completed, expired, moved to another account and purged, and read the
// same after a restart.
func testCountsByAccount(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	step := func(what string, want map[string]map[string]int64) {
		t.Helper()
		if err := checkAccountCounts(s, want); err != nil {
			t.Errorf("after %s: %v", what, err)
		}
	}
	step("nothing", map[string]map[string]int64{})
	for _, x := range []struct{ p, acct, id string }{
		{prov, acctA, "a1"}, {prov, acctA, "a2"}, {prov, acctA, "a3"}, {prov, acctB, "b1"}, {prov, "", "n1"}, {prov2, acctC, "c1"},
	} {
		if _, err := s.AddTask(ctx, accountTask(x.p, x.acct, x.id, t0, t0.Add(time.Minute))); err != nil {
			t.Fatal(err)
		}
	}
	step("six tasks", map[string]map[string]int64{prov: {acctA: 3, acctB: 1, "": 1}, prov2: {acctC: 1}})
	insert(t, s, inState("a1", t0, store.StateDelivered))
	step("a result", map[string]map[string]int64{prov: {acctA: 2, acctB: 1, "": 1}, prov2: {acctC: 1}})
	upd := func(id string, fn func(tk *store.Task)) {
		t.Helper()
		if _, err := s.UpdateTask(ctx, key(id), func(tk *store.Task) error { fn(tk); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	upd("a2", func(tk *store.Task) { tk.State, tk.NextPollAt = store.TaskExpired, time.Time{} })
	step("an expiry", map[string]map[string]int64{prov: {acctA: 1, acctB: 1, "": 1}, prov2: {acctC: 1}})
	upd("n1", func(tk *store.Task) { tk.Account = acctB })
	step("an account given", map[string]map[string]int64{prov: {acctA: 1, acctB: 2}, prov2: {acctC: 1}})
	upd("a2", func(tk *store.Task) { tk.Account = acctB }) // not pending: counted nowhere
	step("an account given to an expired task", map[string]map[string]int64{prov: {acctA: 1, acctB: 2}, prov2: {acctC: 1}})
	upd("a3", func(tk *store.Task) { tk.Polls++; tk.NextPollAt = t0.Add(time.Hour) })
	step("a poll", map[string]map[string]int64{prov: {acctA: 1, acctB: 2}, prov2: {acctC: 1}})
	// A quarantined result leaves its task pending; purging it takes
	// the task too.
	insert(t, s, inState("b1", t0, store.StateQuarantined))
	if n, err := s.Purge(ctx, store.PurgeQuery{Keys: []store.Key{key("b1")}}); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	want := map[string]map[string]int64{prov: {acctA: 1, acctB: 1}, prov2: {acctC: 1}}
	step("a purge", want)
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		step("a restart", want)
	}
}
