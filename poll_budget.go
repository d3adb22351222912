package pingback

import (
	"context"
	"maps"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

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
		maps.Copy(counts, shared)
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
