package store

import (
	"context"
	"time"
)

// SharedPolling is implemented by a store that several Caddy instances
// share (PostgreSQL): the fallback poller's per-provider res.php budget,
// its rate limit and the submit-to-pingback delays behind the automatic
// "after" are kept in the store, so that any number of instances poll a
// provider no harder than one would. A single-node store does not
// implement it; its poller keeps that state in memory.
type SharedPolling interface {
	// TakePoll reserves one res.php request to provider, if both the
	// rate limit (rate requests per second, bursts of up to burst, by the
	// store's clock) and the budget (requests so far below perTask ×
	// tasks tracked + allowance) allow it now, and counts it.
	TakePoll(ctx context.Context, provider string, limit PollLimit) (PollGrant, error)
	// CountTracked counts one newly tracked task of provider toward the
	// budget.
	CountTracked(ctx context.Context, provider string) error
	// ObserveDelay records one submit-to-pingback delay of provider.
	ObserveDelay(ctx context.Context, provider string, d time.Duration) error
	// RecentDelays returns up to n of the most recent delays of provider,
	// newest first.
	RecentDelays(ctx context.Context, provider string, n int) ([]time.Duration, error)
	// PollBudgets returns the budget's counts of every provider that has
	// any (one small row per provider; nothing is taken or counted).
	PollBudgets(ctx context.Context) (map[string]PollBudget, error)
}

// PollBudget is the counts behind a provider's budget: requests made
// (res.php and getTaskResult) and tasks tracked.
type PollBudget struct {
	Polls, Tracked int64
}

// PollLimit is the rate and budget a TakePoll checks.
type PollLimit struct {
	Rate      float64 // requests per second (> 0)
	Burst     int     // requests at once (>= 1)
	PerTask   int     // budget: requests per tracked task
	Allowance int     // budget: requests on top
}

// PollGrant is what TakePoll decided.
type PollGrant struct {
	// OK: the request is reserved and counted; make it.
	OK bool
	// OverBudget: refused because the budget is spent.
	OverBudget bool
	// Wait: refused by the rate limit; the next request is allowed this
	// much later.
	Wait time.Duration
	// Polls and Tracked are the budget's counts after the decision.
	Polls, Tracked int64
}
