package badgerstore

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// The committer's shortcuts ([presence], [fresh]) spare
// reads; these tests check the answers stay Badger's where they could go
// wrong: a failed commit, a reopen, a change of state by something other
// than the outcome. SelfCheck ([openChecked]) compares every shortcut taken
// in every test of the package with a read.

func TestFreshStateServesTheOutcome(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	rec := testRecord("fresh", store.StateForwarding)
	if _, err := b.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if n := len(b.fresh.m); n != 1 {
		t.Fatalf("%d fresh states after a live insert, want 1 (the outcome would read Badger)", n)
	}
	deliver := func(d *store.Delivery) error {
		if d.State != store.StateForwarding || d.Attempts != 1 || d.Lease.Owner != b.Owner() {
			return store.ErrSkip
		}
		d.State, d.LastStatus = store.StateDelivered, 200
		return nil
	}
	d, err := b.UpdateDelivery(ctx, rec.Key(), deliver)
	if err != nil || d.State != store.StateDelivered {
		t.Fatalf("outcome: %+v, %v; want delivered", d, err)
	}
	if n := len(b.fresh.m); n != 0 {
		t.Errorf("%d fresh states left after the outcome, want 0", n)
	}
	// Now s/ holds the state: a second outcome is refused from it.
	if _, err := b.UpdateDelivery(ctx, rec.Key(), deliver); !errors.Is(err, store.ErrSkip) {
		t.Errorf("second outcome: %v, want ErrSkip", err)
	}
	got, err := b.Get(ctx, rec.Key())
	if err != nil || got.State != store.StateDelivered || got.LastStatus != 200 {
		t.Errorf("Get: %+v, %v; want delivered with status 200", got, err)
	}
}

func TestFreshStateGoesWithAFailedCommit(t *testing.T) {
	b, g := openGated(t)
	rec := testRecord("lost", store.StateForwarding)
	g.failNext()
	if _, err := b.Insert(ctx, rec); !errors.Is(err, errInjected) {
		t.Fatalf("insert: %v, want the injected failure", err)
	}
	// The insert's writes never reached Badger: nothing may answer from
	// the state it would have stored.
	if _, err := b.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
		d.State = store.StateDelivered
		return nil
	}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("outcome after the failed insert: %v, want ErrNotFound", err)
	}
	if n := len(b.fresh.m); n != 0 {
		t.Errorf("%d fresh states after a failed commit, want 0", n)
	}
}

func TestFreshStateGoesWithAPurge(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	rec := testRecord("purged", store.StateForwarding)
	if _, err := b.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Purge(ctx, store.PurgeQuery{Keys: []store.Key{rec.Key()}}); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	if _, err := b.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
		d.State = store.StateDelivered
		return nil
	}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("outcome after the purge: %v, want ErrNotFound (nothing may bring it back)", err)
	}
}

func TestPresenceIsReadAtOpen(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, b *Badger, k store.Key)
		check func(t *testing.T, b *Badger, k store.Key, res store.InsertResult)
	}{
		{"tombstone", func(t *testing.T, b *Badger, k store.Key) {
			if _, err := b.Insert(ctx, testRecord(k.ID, store.StateForwarding)); err != nil {
				t.Fatal(err)
			}
			if n, err := b.Purge(ctx, store.PurgeQuery{Keys: []store.Key{k}}); err != nil || n != 1 {
				t.Fatalf("purge: %d, %v", n, err)
			}
		}, func(t *testing.T, b *Badger, k store.Key, res store.InsertResult) {
			if !res.Purged {
				t.Errorf("re-sent pingback of a purged result: %+v, want a duplicate of the purged one", res)
			}
		}},
		{"task", func(t *testing.T, b *Badger, k store.Key) {
			tk := &store.Task{Provider: k.Provider, ID: k.ID, State: store.TaskPending, SubmittedAt: t0.Add(-time.Minute),
				NextPollAt: t0.Add(time.Minute), ExpiresAt: t0.Add(time.Hour)}
			if _, err := b.AddTask(ctx, tk); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, b *Badger, k store.Key, res store.InsertResult) {
			if res.Existing != nil || !res.SubmittedAt.Equal(t0.Add(-time.Minute)) {
				t.Errorf("pingback of a tracked task: %+v, want stored with the task's submission time", res)
			}
			tk, err := b.GetTask(ctx, k)
			if err != nil || tk.State != store.TaskDone {
				t.Errorf("task after its pingback: %+v, %v; want done", tk, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			k := key("p-" + tc.name)
			b := openTestBadger(t, Options{Dir: dir})
			tc.setup(t, b, k)
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			b = openTestBadger(t, Options{Dir: dir})
			res, err := b.Insert(ctx, testRecord(k.ID, store.StateForwarding))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, b, k, res)
		})
	}
}

// An s/ outlives its r/ (by expiryGrace, so that Expire can still report
// an undelivered record): a pingback stored again under the key after the
// first record's retention ended must not be shadowed by the old state.
func TestLiveInsertOverALingeringDelivery(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	k := key("linger")
	if _, err := b.Insert(ctx, testRecord(k.ID, store.StateForwarding)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.UpdateDelivery(ctx, k, func(d *store.Delivery) error {
		d.State, d.LastStatus = store.StateDelivered, 200
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The retention ends: r/ expires, its s/ lives on for the grace.
	if _, err := b.UpdateRecord(ctx, k, func(r *store.Record) error {
		r.ExpiresAt = time.Now().Add(-time.Minute)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after the retention: %v, want ErrNotFound", err)
	}
	if res, err := b.Insert(ctx, testRecord(k.ID, store.StateForwarding)); err != nil || res.Existing != nil {
		t.Fatalf("insert again: %+v, %v; want stored", res, err)
	}
	got, err := b.Get(ctx, k)
	if err != nil || got.State != store.StateForwarding || got.LastStatus != 0 {
		t.Fatalf("Get of the new record: %+v, %v; want forwarding, no status (the old record's state hides it)", got, err)
	}
	if _, err := b.UpdateDelivery(ctx, k, func(d *store.Delivery) error {
		if d.State != store.StateForwarding {
			return store.ErrSkip
		}
		d.State = store.StateDelivered
		return nil
	}); err != nil {
		t.Errorf("the new record's outcome: %v, want recorded", err)
	}
}
