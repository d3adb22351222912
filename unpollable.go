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
		h.unpollableLogged[acct] = now
	}
	h.mu.Unlock()
	if logIt {
		a.logger.Warn("tasks submitted with an API key this Caddy does not know: their results can only arrive by pingback; add the key to the provider's api_key",
			zap.String("provider", acct.Provider), zap.String("account", acct.ID), zap.Int64("tasks", n))
	}
}

// noteRemovedAccounts counts, when a config starts on a store handle that
// an earlier config used, the pending tasks of every account the earlier
// config had a key for and this one has not: a reload that removed a key
// makes them unpollable. It then records this config's accounts for the
// next reload. Adding a key back makes its tasks pollable again (nothing
// to count: unpollable is derived from the config).
func (a *App) noteRemovedAccounts(ctx context.Context) {
	now := map[store.Account]bool{}
	for _, acct := range a.pollAccounts() {
		now[acct] = true
	}
	h := a.handle
	h.mu.Lock()
	before := h.configured
	h.configured = now
	h.mu.Unlock()
	var removed []store.Account
	for acct := range before {
		if !now[acct] {
			removed = append(removed, acct)
		}
	}
	if len(removed) == 0 {
		return
	}
	c, err := h.store.Counts(ctx)
	if err != nil {
		a.logger.Warn("counting the pending tasks of removed API keys failed", zap.Error(err))
		return
	}
	for _, acct := range removed {
		if n := c.TasksPendingByAccount[acct.Provider][acct.ID]; n > 0 {
			a.metrics.unpollable.WithLabelValues(acct.Provider).Add(float64(n))
			a.warnUnpollable(acct, n)
		}
	}
}
