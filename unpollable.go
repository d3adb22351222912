package pingback

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// unpollableLogEvery is how often, at most, the warning about tasks of an
// unknown API key is logged per account.
const unpollableLogEvery = time.Hour

// noteUnpollable counts a newly tracked task whose API key is not one of
// its provider's configured keys (caddy_pingback_tasks_unpollable_total)
// and warns, once per account id and hour: its pingback is still received,
// deduplicated and delivered, but it is never polled with another key.
func (a *App) noteUnpollable(t *store.Task) {
	a.metrics.unpollable.WithLabelValues(t.Provider).Inc()
	a.warnUnpollable(store.Account{Provider: t.Provider, ID: t.Account}, 1)
}

// warnUnpollable logs the unpollable warning for acct unless it was
// logged for it within the last hour; n is how many tasks this time.
func (a *App) warnUnpollable(acct store.Account, n int64) {
	now := a.now()
	h := a.handle
	h.mu.Lock()
	if h.unpollableLogged == nil {
		h.unpollableLogged = map[store.Account]time.Time{}
	}
	last, seen := h.unpollableLogged[acct]
	logIt := !seen || now.Sub(last) >= unpollableLogEvery
	if logIt {
		// An entry older than the hour only says to log again: dropped,
		// so that many keys seen once do not pile up.
		for k, at := range h.unpollableLogged {
			if now.Sub(at) >= unpollableLogEvery {
				delete(h.unpollableLogged, k)
			}
		}
		h.unpollableLogged[acct] = now
	}
	h.mu.Unlock()
	if logIt {
		a.logger.Warn("tasks submitted with an API key this Caddy does not know: their results can only arrive by pingback; add the key to the provider's api_key",
			zap.String("provider", acct.Provider), zap.String("account", acct.ID), zap.Int64("tasks", n))
	}
}

// noteRemovedAccounts counts, when a config starts while another config
// on the same store handle runs (a reload), the pending tasks of every
// account the running config has a key for and this one has not: the
// reload makes them unpollable. Comparing with the running config, not
// with the last one started, keeps the count right when Caddy rolls a
// reload back. At the first start there is nothing to compare with:
// pending tasks of accounts without a key are warned about, not counted
// (they were counted when they became unpollable). Adding a key back makes
// its tasks pollable again; nothing to count, unpollable being derived
// from the config.
func (a *App) noteRemovedAccounts(ctx context.Context) {
	h := a.handle
	h.mu.Lock()
	var prev *App
	for _, x := range h.apps {
		if x != a {
			prev = x // the last one: the loops' owner until a took over
		}
	}
	h.mu.Unlock()
	accountsOf := func(x *App) map[store.Account]bool {
		m := map[store.Account]bool{}
		for _, acct := range x.pollAccounts() {
			m[acct] = true
		}
		return m
	}
	now := accountsOf(a)
	c, err := h.store.Counts(ctx)
	if err != nil {
		a.logger.Warn("counting the pending tasks of accounts without a key failed", zap.Error(err))
		return
	}
	if prev == nil {
		for provider, m := range c.TasksPendingByAccount {
			for id, n := range m {
				if acct := (store.Account{Provider: provider, ID: id}); n > 0 && !a.taskPollable(&store.Task{Provider: provider, Account: id}) {
					a.warnUnpollable(acct, n)
				}
			}
		}
		return
	}
	for acct := range accountsOf(prev) {
		if now[acct] {
			continue
		}
		if n := c.TasksPendingByAccount[acct.Provider][acct.ID]; n > 0 {
			a.metrics.unpollable.WithLabelValues(acct.Provider).Add(float64(n))
			a.warnUnpollable(acct, n)
		}
	}
}
