package pingback

import (
	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// accountStatuses is the accounts part of /pingback/status: provider →
// account id → budget and tasks, for every configured account and every
// account with pending tasks. Counts are the store's (database-wide on
// PostgreSQL); which accounts are unpollable is this config's.
func (a *App) accountStatuses(c store.Counts, budget map[store.Account]adminapi.BudgetStatus) map[string]map[string]adminapi.AccountStatus {
	out := map[string]map[string]adminapi.AccountStatus{}
	put := func(provider, id string, f func(*adminapi.AccountStatus)) {
		m := out[provider]
		if m == nil {
			m = map[string]adminapi.AccountStatus{}
			out[provider] = m
		}
		s := m[id]
		f(&s)
		m[id] = s
	}
	l := a.pollLimit()
	for name, pc := range a.Providers {
		if pc == nil {
			continue
		}
		for _, acc := range pc.accounts {
			put(name, acc.id, func(s *adminapi.AccountStatus) {
				s.APIKeyEntry, s.Left = acc.configured, int64(l.Allowance)
			})
		}
	}
	for acct, b := range budget {
		if acct.ID == "" {
			continue // counted before accounts: no account to show it under
		}
		put(acct.Provider, acct.ID, func(s *adminapi.AccountStatus) { s.Used, s.Left = b.Used, b.Left })
	}
	for provider, m := range c.TasksPendingByAccount {
		pc := a.providerConfig(provider)
		for id, n := range m {
			_, known := pc.taskAccount(id)
			put(provider, id, func(s *adminapi.AccountStatus) {
				s.Pending = n
				if !known {
					s.Unpollable = n
				}
			})
		}
	}
	return out
}

// unpollableOf sums the unpollable tasks of a provider's accounts.
func unpollableOf(accounts map[string]adminapi.AccountStatus) int64 {
	var n int64
	for _, s := range accounts {
		n += s.Unpollable
	}
	return n
}

// providerBudgets sums the accounts' budgets per provider: the status's
// provider totals.
func providerBudgets(budget map[store.Account]adminapi.BudgetStatus) map[string]adminapi.BudgetStatus {
	out := map[string]adminapi.BudgetStatus{}
	for acct, b := range budget {
		s := out[acct.Provider]
		s.Used += b.Used
		s.Left += b.Left
		out[acct.Provider] = s
	}
	return out
}
