package admin

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// deadLetterStates are the states GET /pingback/deadletters groups, in
// the order it scans them: what needs a person first.
var deadLetterStates = []store.State{store.StateParked, store.StateRejected, store.StateFailed}

// deadLetterScan bounds the records one GET /pingback/deadletters reads;
// deadLetterPage is the page it reads them by.
const (
	deadLetterScan = 10000
	deadLetterPage = 500
)

// deadLetters answers GET /pingback/deadletters: the parked, rejected and
// failed results grouped by route, provider, state and last error, each
// group with its count and its first and last seen failure times
// (adminapi.DeadLetters), the most recently seen group first. It reads at
// most deadLetterScan records through the store's pages (parked first,
// then rejected, then failed, each oldest first) and says so in truncated
// when it stopped there. 503 while the store is not open, 500 when a page
// fails.
func (api *API) deadLetters(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(r, "GET")
	}
	_, st, err := api.store()
	if err != nil {
		return err
	}
	ans, err := groupDeadLetters(r.Context(), st, deadLetterScan)
	if err != nil {
		return storeAPIError(err)
	}
	return writeJSON(w, ans)
}

// deadLetterKey is what a group shares.
type deadLetterKey struct {
	route, provider string
	state           store.State
	err             string
}

// groupDeadLetters reads at most limit records of deadLetterStates from
// st and groups them.
func groupDeadLetters(ctx context.Context, st store.Store, limit int) (adminapi.DeadLetters, error) {
	groups := map[deadLetterKey]*adminapi.DeadLetterGroup{}
	ans := adminapi.DeadLetters{Groups: []adminapi.DeadLetterGroup{}}
scan:
	for _, state := range deadLetterStates {
		q := store.ListQuery{State: state}
		for {
			q.Limit = min(deadLetterPage, limit-ans.Scanned)
			if q.Limit == 0 {
				ans.Truncated = true
				break scan
			}
			page, err := st.ListPage(ctx, q)
			if err != nil {
				return adminapi.DeadLetters{}, err
			}
			for _, rec := range page.Records {
				if rec.State != state { // changed between the index and the read
					continue
				}
				addDeadLetter(groups, rec)
			}
			ans.Scanned += len(page.Records)
			if page.Next == nil {
				break
			}
			q.After = page.Next
		}
	}
	for _, g := range groups {
		ans.Groups = append(ans.Groups, *g)
	}
	slices.SortFunc(ans.Groups, func(a, b adminapi.DeadLetterGroup) int {
		return cmp.Or(b.LastSeen.Compare(a.LastSeen), strings.Compare(a.Route, b.Route), strings.Compare(a.Provider, b.Provider),
			strings.Compare(string(a.State), string(b.State)), strings.Compare(a.Error, b.Error))
	})
	return ans, nil
}

// addDeadLetter counts rec in its group.
func addDeadLetter(groups map[deadLetterKey]*adminapi.DeadLetterGroup, rec *store.Record) {
	k := deadLetterKey{route: recordRoute(rec), provider: rec.Provider, state: rec.State, err: rec.LastError}
	at := lastFailureAt(rec)
	g, ok := groups[k]
	if !ok {
		groups[k] = &adminapi.DeadLetterGroup{Route: k.route, Provider: k.provider, State: k.state, Error: k.err,
			Count: 1, FirstSeen: at, LastSeen: at}
		return
	}
	g.Count++
	if at.Before(g.FirstSeen) {
		g.FirstSeen = at
	}
	if at.After(g.LastSeen) {
		g.LastSeen = at
	}
}

// recordRoute is the route rec is forwarded to: its request's host and
// path, without the query (which may hold a code), as the replay loop
// names routes.
func recordRoute(rec *store.Record) string {
	path, _, _ := strings.Cut(rec.Request.URI, "?")
	return rec.Request.Host + path
}

// lastFailureAt is when rec last failed: the end (else the start) of its
// latest attempt that was not a delivery, else its last update.
func lastFailureAt(rec *store.Record) time.Time {
	for i := len(rec.History) - 1; i >= 0; i-- {
		a := rec.History[i]
		if a.Outcome == "" || a.Outcome == store.OutcomeDelivered {
			continue
		}
		if !a.EndedAt.IsZero() {
			return a.EndedAt.UTC()
		}
		return a.StartedAt.UTC()
	}
	return rec.UpdatedAt.UTC()
}
