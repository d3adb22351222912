package pgstore_test

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// TestPostgresSharedPolling: two instances on one database share one
// res.php budget and one rate limit per account, and see each other's
// delays; an account over its budget or at its rate limit does not limit
// another account of the same provider.
func TestPostgresSharedPolling(t *testing.T) {
	a, b := twoInstances(t)
	ctx := context.Background()
	now := time.Now()
	var clock atomic.Int64
	clock.Store(now.UnixNano())
	for _, s := range []*pgstore.Postgres{a, b} {
		pgstore.SetClock(s, func() time.Time { return time.Unix(0, clock.Load()) })
	}

	spent := store.Account{Provider: "budget", ID: "00000000000000aa"}
	other := store.Account{Provider: "budget", ID: "00000000000000bb"}
	t.Run("budget", func(t *testing.T) {
		for range 3 {
			if err := a.CountTracked(ctx, spent); err != nil {
				t.Fatal(err)
			}
		}
		// 2 per task + 4: 10 requests in all, whichever instance asks.
		limit := store.PollLimit{Rate: 1000, Burst: 1000, PerTask: 2, Allowance: 4}
		var ok atomic.Int64
		var wg sync.WaitGroup
		for i := range 40 {
			s := a
			if i%2 == 1 {
				s = b
			}
			wg.Go(func() {
				g, err := s.TakePoll(ctx, spent, limit)
				if err != nil {
					t.Error(err)
				}
				if g.OK {
					ok.Add(1)
				} else if !g.OverBudget {
					t.Errorf("refused, not over budget: %+v", g)
				}
			})
		}
		wg.Wait()
		if ok.Load() != 10 {
			t.Errorf("%d requests granted across two instances, want the budget's 10", ok.Load())
		}
		// The provider's other account has a budget of its own: its
		// allowance of 4, then, with one task tracked, 2 more.
		for i, want := range []bool{true, true, true, true, false} {
			if g, err := b.TakePoll(ctx, other, limit); err != nil || g.OK != want || g.OverBudget == want {
				t.Errorf("request %d of the other account: %+v, %v; want OK %v", i+1, g, err, want)
			}
		}
		if err := b.CountTracked(ctx, other); err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{true, true, false} {
			if g, err := a.TakePoll(ctx, other, limit); err != nil || g.OK != want {
				t.Errorf("request %d of the other account after a task: %+v, %v; want OK %v", i+1, g, err, want)
			}
		}
		got, err := a.PollBudgets(ctx)
		want := map[store.Account]store.PollBudget{spent: {Polls: 10, Tracked: 3}, other: {Polls: 6, Tracked: 1}}
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("PollBudgets = %v, %v; want %v", got, err, want)
		}
	})

	rate := store.Account{Provider: "rate", ID: "00000000000000aa"}
	t.Run("rate", func(t *testing.T) {
		limit := store.PollLimit{Rate: 5, Burst: 5, PerTask: 10, Allowance: 600}
		granted := 0
		for i := range 20 {
			s := a
			if i%2 == 1 {
				s = b
			}
			g, err := s.TakePoll(ctx, rate, limit)
			if err != nil {
				t.Fatal(err)
			}
			if g.OK {
				granted++
			} else if g.Wait <= 0 || g.Wait > 200*time.Millisecond {
				t.Errorf("refused with wait %s, want within one step (200ms)", g.Wait)
			}
		}
		if granted != 5 {
			t.Errorf("%d requests granted at one instant, want the burst of 5", granted)
		}
		// At the same instant, another account of the provider (and the
		// provider's rows of before accounts, "") have bursts of their own.
		for _, acct := range []store.Account{{Provider: "rate", ID: "00000000000000bb"}, {Provider: "rate"}} {
			granted = 0
			for range 10 {
				if g, _ := a.TakePoll(ctx, acct, limit); g.OK {
					granted++
				}
			}
			if granted != 5 {
				t.Errorf("%d requests granted to %s while %s is at its rate limit, want its own burst of 5", granted, acct, rate)
			}
		}
		clock.Add(int64(time.Second)) // a second later: five more
		granted = 0
		for range 10 {
			if g, _ := b.TakePoll(ctx, rate, limit); g.OK {
				granted++
			}
		}
		if granted != 5 {
			t.Errorf("%d requests granted a second later, want 5", granted)
		}
	})

	t.Run("delays", func(t *testing.T) {
		for i := range 3 {
			s := a
			if i == 1 {
				s = b
			}
			if err := s.ObserveDelay(ctx, "lat", time.Duration(i+1)*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		got, err := b.RecentDelays(ctx, "lat", 2)
		if err != nil || len(got) != 2 || got[0] != 3*time.Second || got[1] != 2*time.Second {
			t.Errorf("RecentDelays = %v, %v; want [3s 2s]", got, err)
		}
	})
}
