package store

import (
	"context"
	"time"
)

// SharedPolling is implemented by a store that several Caddy instances
// share (PostgreSQL): the fallback poller's res.php budget and rate limit,
// per account (a provider's limits are per API key), and the
// submit-to-pingback delays behind the automatic "after", per provider,
// are kept in the store, so that any number of instances poll an account
// no harder than one would. One account's spent budget or rate limit
// never limits another account, of the same provider or not. A
// single-node store does not implement it; its poller keeps that state in
// memory.
type SharedPolling interface {
	// TakePoll reserves one res.php request with acct's key, if both the
	// account's rate limit (rate requests per second, bursts of up to
	// burst, by the store's clock) and its budget (requests so far below
	// perTask × tasks tracked + allowance) allow it now, and counts it.
	TakePoll(ctx context.Context, acct Account, limit PollLimit) (PollGrant, error)
	// CountTracked counts one newly tracked task of acct toward its
	// budget.
	CountTracked(ctx context.Context, acct Account) error
	// ObserveDelay records one submit-to-pingback delay of provider.
	ObserveDelay(ctx context.Context, provider string, d time.Duration) error
	// RecentDelays returns up to n of the most recent delays of provider,
	// newest first.
	RecentDelays(ctx context.Context, provider string, n int) ([]time.Duration, error)
	// PollBudgets returns the budget's counts of every account that has
	// any (one small row per account; nothing is taken or counted). The
	// rows of a database migrated from schema 8 or earlier are those of
	// account "" unless PostgresOptions.LegacyAccounts named the
	// provider's account.
	PollBudgets(ctx context.Context) (map[Account]PollBudget, error)
}

// PollBudget is the counts behind an account's budget: requests made
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
