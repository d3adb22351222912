package pingback

import (
	"context"
	"maps"
	"math"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// sharedTimeout bounds one call for the shared state.
const sharedTimeout = 5 * time.Second

// sharedPolling returns the store's shared poll state, or nil.
//
// The poller's per-provider state shared through the store: with a store
// that several instances share (store.SharedPolling: PostgreSQL), the
// res.php budget, the rate limit and the delays behind the automatic
// "after" are the database's, so two instances never poll twice as hard.
// With a single-node store they stay in memory (providerState).
func (h *storeHandle) sharedPolling() store.SharedPolling {
	sp, _ := h.store.(store.SharedPolling)
	return sp
}

// pollLimit is the shared rate and budget of one provider.
func (a *App) pollLimit() store.PollLimit {
	return store.PollLimit{
		Rate:      a.Poll.Rate,
		Burst:     max(1, int(math.Ceil(a.Poll.Rate))),
		PerTask:   10,
		Allowance: pollAllowance,
	}
}

// takePoll reports whether one res.php or getTaskResult request to the
// provider may be made now: by the store's shared rate and budget if it keeps them
// (overBudget: the shared budget is spent), else by the in-process
// limiter (pollProvider checks the in-process budget).
func (a *App) takePoll(name string, ps *providerState) (ok, overBudget bool, wait time.Duration) {
	sp := a.handle.sharedPolling()
	if sp == nil {
		return ps.limiter.Allow(), false, 0
	}
	ctx, cancel := context.WithTimeout(a.loopCtx, sharedTimeout)
	defer cancel()
	g, err := sp.TakePoll(ctx, store.Account{Provider: name}, a.pollLimit())
	if err != nil {
		a.logger.Warn("taking a res.php request from the shared budget failed; polling pauses", zap.String("provider", name), zap.Error(err))
		return false, false, 0
	}
	if g.OverBudget {
		ps.mu.Lock()
		first := !ps.budgetLogged
		ps.budgetLogged = true
		ps.mu.Unlock()
		if first {
			a.logger.Warn("res.php budget reached (shared by every instance on this store): polling slowed to stay well under the provider's 20 requests per task",
				zap.String("provider", name), zap.Int64("polls", g.Polls), zap.Int64("tasks", g.Tracked))
		}
	}
	return g.OK, g.OverBudget, g.Wait
}

// waitPoll waits until one res.php request to the provider may be made;
// false if the loop stops first or the shared budget is spent.
func (a *App) waitPoll(name string, ps *providerState) bool {
	if a.handle.sharedPolling() == nil {
		return ps.limiter.Wait(a.loopCtx) == nil
	}
	for {
		ok, over, wait := a.takePoll(name, ps)
		switch {
		case ok:
			return true
		case over:
			return false
		}
		t := time.NewTimer(min(max(wait, 10*time.Millisecond), time.Second))
		select {
		case <-a.loopCtx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// countTracked counts a newly tracked task toward the provider's budget:
// in the store if it is shared, and in memory.
func (a *App) countTracked(name string, ps *providerState) {
	ps.mu.Lock()
	ps.tracked++
	ps.mu.Unlock()
	if sp := a.handle.sharedPolling(); sp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
		defer cancel()
		if err := sp.CountTracked(ctx, store.Account{Provider: name}); err != nil {
			a.logger.Warn("counting a tracked task in the shared res.php budget failed", zap.String("provider", name), zap.Error(err))
		}
	}
}

// pollBudgets returns the budget of every provider the poller has counted
// anything for: database-wide with a shared store (store.SharedPolling),
// else this process's since it started.
func (a *App) pollBudgets(ctx context.Context) (map[string]adminapi.BudgetStatus, error) {
	counts := map[string]store.PollBudget{}
	if sp := a.handle.sharedPolling(); sp != nil {
		shared, err := sp.PollBudgets(ctx)
		if err != nil {
			return nil, err
		}
		for acct, c := range shared {
			sum := counts[acct.Provider]
			counts[acct.Provider] = store.PollBudget{Polls: sum.Polls + c.Polls, Tracked: sum.Tracked + c.Tracked}
		}
	} else {
		a.handle.mu.Lock()
		states := maps.Clone(a.handle.providers)
		a.handle.mu.Unlock()
		for name, ps := range states {
			ps.mu.Lock()
			counts[name] = store.PollBudget{Polls: int64(ps.polls), Tracked: int64(ps.tracked)}
			ps.mu.Unlock()
		}
	}
	l := a.pollLimit()
	out := make(map[string]adminapi.BudgetStatus, len(counts))
	for name, c := range counts {
		out[name] = adminapi.BudgetStatus{Used: c.Polls, Left: max(0, int64(l.PerTask)*c.Tracked+int64(l.Allowance)-c.Polls)}
	}
	return out, nil
}

// overPollBudget reports whether polls result requests for tracked tasks
// spent the in-process res.php budget (10 per task plus pollAllowance).
func overPollBudget(polls, tracked int) bool { return polls >= 10*tracked+pollAllowance }

// overBudget reports whether the provider's in-process res.php budget,
// shared by the poller and the confirmations, is spent.
func (ps *providerState) overBudget() bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return overPollBudget(ps.polls, ps.tracked)
}
