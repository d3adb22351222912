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
// The poller's state shared through the store: with a store that several
// instances share (store.SharedPolling: PostgreSQL), each account's
// res.php budget and rate limit, and each provider's delays behind the
// automatic "after", are the database's, so two instances never poll an
// account twice as hard. With a single-node store they stay in memory
// (accountState, providerState).
func (h *storeHandle) sharedPolling() store.SharedPolling {
	sp, _ := h.store.(store.SharedPolling)
	return sp
}

// pollLimit is the rate and budget of one account.
func (a *App) pollLimit() store.PollLimit {
	return store.PollLimit{
		Rate:      a.Poll.Rate,
		Burst:     max(1, int(math.Ceil(a.Poll.Rate))),
		PerTask:   10,
		Allowance: pollAllowance,
	}
}

// takePoll reports whether one res.php or getTaskResult request with the
// account's key may be made now: by the store's shared rate and budget if
// it keeps them (overBudget: the shared budget is spent), else by the
// account's in-process limiter (pollAccount checks the in-process budget).
func (a *App) takePoll(acct store.Account, as *accountState) (ok, overBudget bool, wait time.Duration) {
	sp := a.handle.sharedPolling()
	if sp == nil {
		return as.limiter.Allow(), false, 0
	}
	ctx, cancel := context.WithTimeout(a.loopCtx, sharedTimeout)
	defer cancel()
	g, err := sp.TakePoll(ctx, acct, a.pollLimit())
	if err != nil {
		a.logger.Warn("taking a res.php request from the shared budget failed; polling pauses",
			zap.String("provider", acct.Provider), zap.String("account", acct.ID), zap.Error(err))
		return false, false, 0
	}
	if g.OverBudget {
		if as.setOnce(&as.budgetLogged) {
			a.logger.Warn("res.php budget reached (shared by every instance on this store): polling slowed to stay well under the provider's 20 requests per task",
				zap.String("provider", acct.Provider), zap.String("account", acct.ID), zap.Int64("polls", g.Polls), zap.Int64("tasks", g.Tracked))
			a.noteAccountEvent(EventAccountOutOfBudget, acct)
		}
	}
	return g.OK, g.OverBudget, g.Wait
}

// waitPoll waits until one request with the account's key may be made;
// false if the loop stops first or the shared budget is spent.
func (a *App) waitPoll(acct store.Account, as *accountState) bool {
	if a.handle.sharedPolling() == nil {
		return as.limiter.Wait(a.loopCtx) == nil
	}
	for {
		ok, over, wait := a.takePoll(acct, as)
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

// countTracked counts a newly tracked task toward its account's budget:
// in the store if it is shared, and in memory.
func (a *App) countTracked(acct store.Account) {
	as := a.handle.account(acct)
	as.mu.Lock()
	as.tracked++
	as.mu.Unlock()
	if sp := a.handle.sharedPolling(); sp != nil {
		ctx, cancel := context.WithTimeout(context.Background(), sharedTimeout)
		defer cancel()
		if err := sp.CountTracked(ctx, acct); err != nil {
			a.logger.Warn("counting a tracked task in the shared res.php budget failed",
				zap.String("provider", acct.Provider), zap.String("account", acct.ID), zap.Error(err))
		}
	}
}

// pollBudgets returns the budget of every account the poller has counted
// anything for: database-wide with a shared store (store.SharedPolling),
// else this process's since it started.
func (a *App) pollBudgets(ctx context.Context) (map[store.Account]adminapi.BudgetStatus, error) {
	counts := map[store.Account]store.PollBudget{}
	if sp := a.handle.sharedPolling(); sp != nil {
		shared, err := sp.PollBudgets(ctx)
		if err != nil {
			return nil, err
		}
		maps.Copy(counts, shared)
	} else {
		a.handle.mu.Lock()
		states := maps.Clone(a.handle.accounts)
		a.handle.mu.Unlock()
		for acct, as := range states {
			as.mu.Lock()
			counts[acct] = store.PollBudget{Polls: int64(as.polls), Tracked: int64(as.tracked)}
			as.mu.Unlock()
		}
	}
	l := a.pollLimit()
	out := make(map[store.Account]adminapi.BudgetStatus, len(counts))
	for acct, c := range counts {
		out[acct] = adminapi.BudgetStatus{Used: c.Polls, Left: max(0, int64(l.PerTask)*c.Tracked+int64(l.Allowance)-c.Polls)}
	}
	return out, nil
}

// overPollBudget reports whether polls result requests for tracked tasks
// spent an account's in-process res.php budget (10 per task plus
// pollAllowance).
func overPollBudget(polls, tracked int) bool { return polls >= 10*tracked+pollAllowance }
