package badgerstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// TestBadgerFormat4BuildsTaskOrder: a store of format 4 (no o/ entries)
// gets them at open, with the tasks' TTLs, and lists its tasks in
// submission-time order, by state too.
func TestBadgerFormat4BuildsTaskOrder(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	t0 := time.Now().UTC().Truncate(time.Second)
	for i, id := range []string{"c", "a", "b"} {
		tk := &store.Task{Provider: "captchaai", ID: id, State: store.TaskPending, SubmittedAt: t0.Add(time.Duration(i) * time.Second),
			NextPollAt: t0.Add(time.Minute), ExpiresAt: t0.Add(time.Hour)}
		if id == "a" {
			tk.State, tk.NextPollAt = store.TaskExpired, time.Time{}
		}
		if _, err := b.AddTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	downgrade(t, dir, taskOrderPrefix, "4")
	b = openTestBadger(t, Options{Dir: dir})
	if err := CheckIndexes(b); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		q    store.TaskQuery
		want string
	}{
		{store.TaskQuery{Limit: 10}, "cab"},
		{store.TaskQuery{State: store.TaskPending, Limit: 10}, "cb"},
		{store.TaskQuery{Provider: "captchaai", State: store.TaskExpired, Limit: 10}, "a"},
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

// BenchmarkListTaskPage measures one page of 100 from a Badger store of
// n tasks (two providers; 1 % pending, 10 % expired, the rest done): the
// first page, a page in the middle (by cursor), one provider's, the
// pending ones' and one provider's pending ones. A page should cost the
// same whatever n is.
func BenchmarkListTaskPage(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		s := openTestBadger(b, Options{Dir: b.TempDir()})
		t0 := time.Now().UTC().Add(-time.Hour)
		concurrently(b, n, func(i int) error {
			tk := &store.Task{Provider: "captchaai", ID: fmt.Sprint(i), State: store.TaskDone, SubmittedAt: t0.Add(time.Duration(i) * time.Millisecond),
				ExpiresAt: t0.Add(48 * time.Hour)}
			switch {
			case i%100 == 0:
				tk.State, tk.NextPollAt = store.TaskPending, t0.Add(time.Hour)
			case i%10 == 1:
				tk.State = store.TaskExpired
			}
			if i%2 == 0 {
				tk.Provider = "2captcha"
			}
			_, err := s.AddTask(ctx, tk)
			return err
		})
		mid, err := s.ListTaskPage(ctx, store.TaskQuery{Limit: n / 2})
		if err != nil {
			b.Fatal(err)
		}
		for _, q := range []struct {
			name string
			q    store.TaskQuery
		}{
			{"first", store.TaskQuery{Limit: 100}},
			{"middle", store.TaskQuery{Limit: 100, After: mid.Next}},
			{"provider", store.TaskQuery{Limit: 100, Provider: "2captcha", After: mid.Next}},
			{"pending", store.TaskQuery{Limit: 100, State: store.TaskPending}},
			{"provider-pending", store.TaskQuery{Limit: 40, Provider: "2captcha", State: store.TaskPending}},
		} {
			b.Run(fmt.Sprintf("n=%d/%s", n, q.name), func(b *testing.B) {
				for b.Loop() {
					p, err := s.ListTaskPage(ctx, q.q)
					if err != nil || len(p.Tasks) != q.q.Limit {
						b.Fatalf("%d tasks, %v", len(p.Tasks), err)
					}
				}
			})
		}
	}
}

// concurrently runs fn(0..n-1), 256 at a time (so that group commit
// fills each commit), and fails b on the first error.
func concurrently(b *testing.B, n int, fn func(i int) error) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(i); err != nil {
				b.Error(err)
			}
		}()
	}
	wg.Wait()
}

// downgrade makes the store in dir look written by an earlier format: the
// keys under prefix (an index that format lacked) dropped, the format key
// set to format.
func downgrade(t *testing.T, dir, prefix, format string) {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.DropPrefix([]byte(prefix)); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte(metaFormatKey), []byte(format)) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}
