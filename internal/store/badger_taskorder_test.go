package store

import (
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// TestBadgerFormat4BuildsTaskOrder: a store of format 4 (no o/ entries)
// gets them at open, with the tasks' TTLs, and lists its tasks in
// submission-time order, by state too.
func TestBadgerFormat4BuildsTaskOrder(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, BadgerOptions{Dir: dir})
	t0 := time.Now().UTC().Truncate(time.Second)
	for i, id := range []string{"c", "a", "b"} {
		tk := &Task{Provider: "captchaai", ID: id, State: TaskPending, SubmittedAt: t0.Add(time.Duration(i) * time.Second),
			NextPollAt: t0.Add(time.Minute), ExpiresAt: t0.Add(time.Hour)}
		if id == "a" {
			tk.State, tk.NextPollAt = TaskExpired, time.Time{}
		}
		if _, err := b.AddTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.DropPrefix([]byte(taskOrderPrefix)); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte(metaFormatKey), []byte("4")) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTestBadger(t, BadgerOptions{Dir: dir})
	if err := CheckIndexes(b); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		q    TaskQuery
		want string
	}{
		{TaskQuery{Limit: 10}, "cab"},
		{TaskQuery{State: TaskPending, Limit: 10}, "cb"},
		{TaskQuery{Provider: "captchaai", State: TaskExpired, Limit: 10}, "a"},
	} {
		p, err := b.ListTaskPage(ctx, x.q)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, tk := range p.Tasks {
			got += tk.ID
		}
		if got != x.want || p.Next != nil {
			t.Errorf("ListTaskPage(%+v) after the upgrade: %q (next %v), want %q", x.q, got, p.Next, x.want)
		}
	}
}
