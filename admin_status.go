package pingback

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
)

// Status is the overview GET /pingback/status answers (counts from
// store.Counter, never a scan of the records); its errors are 503
// caddy.APIErrors (the store not running or not answering).
func (a *App) Status(ctx context.Context) (adminapi.StatusAnswer, error) {
	st := a.store(time.Second)
	if st == nil {
		return adminapi.StatusAnswer{}, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errStoreUnavailable}
	}
	c, err := st.Counts(ctx)
	if err != nil {
		return adminapi.StatusAnswer{}, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the store's counts: %w", err)}
	}
	ages, ok := a.currentAges(ctx, st)
	if !ok {
		return adminapi.StatusAnswer{}, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errors.New("reading the store's ages failed")}
	}
	budget, err := a.pollBudgets(ctx)
	if err != nil {
		return adminapi.StatusAnswer{}, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: fmt.Errorf("reading the poll budget: %w", err)}
	}
	accounts := a.accountStatuses(c, budget)
	ans := adminapi.StatusAnswer{Records: c.Records, Tasks: map[string]adminapi.TaskStatus{}, Loops: map[string]adminapi.LoopStatus{},
		OldestUndeliveredAgeSeconds: map[string]float64{}, LastCallbackAt: ages.LastCallback, Budget: providerBudgets(budget),
		Accounts: accounts, Routes: a.routeStatuses(time.Now())}
	ans.Pauses = adminapi.PausesOf(a.pauseList())
	if ans.Records == nil {
		ans.Records = map[string]map[store.State]int64{}
	}
	if ans.Routes == nil {
		ans.Routes = map[string]adminapi.RouteStatus{}
	}
	ans.RouteHealth, ans.Notifications = a.routeHealthStatuses(), a.recentNotifications()
	if ans.LastCallbackAt == nil {
		ans.LastCallbackAt = map[string]time.Time{}
	}
	now := a.now()
	for _, p := range countedProviders(c) {
		ans.Tasks[p] = adminapi.TaskStatus{Pending: c.TasksPending[p], Unpollable: unpollableOf(accounts[p]),
			OldestPendingAgeSeconds: roundAge(ageAt(ages.OldestPendingTask[p], now))}
		ans.OldestUndeliveredAgeSeconds[p] = roundAge(ageAt(ages.OldestUndelivered[p], now))
	}
	every := map[string]time.Duration{"replay": time.Second, "poll": time.Second}
	for loop, d := range every {
		ls := adminapi.LoopStatus{LastRunAt: a.loopLastRun(loop).UTC()}
		if !ls.LastRunAt.IsZero() {
			ls.NextRunAt = ls.LastRunAt.Add(d)
		}
		ans.Loops[loop] = ls
	}
	kind := ""
	if m, ok := a.storeMod.(caddy.Module); ok {
		kind = m.CaddyModule().ID.Name()
	}
	ans.Store = adminapi.StoreStatus{Kind: kind, Location: a.name, Available: st.Available()}
	if _, ok := a.storeMod.(*BadgerStore); ok {
		if free, err := badgerstore.FreeBytes(a.dir); err == nil {
			ans.Store.FreeBytes = &free
		}
	}
	return ans, nil
}
