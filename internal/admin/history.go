package admin

import (
	"net/http"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
)

// defaultHistorySpan is the range GET /pingback/history answers without
// from: the last hour.
const defaultHistorySpan = time.Hour

// history answers GET /pingback/history?from=<RFC 3339>&to=<RFC 3339>:
// the per-minute figures of [from, to) (Backend.History), from rounded
// down and to rounded up to whole minutes. Defaults: to is the end of the
// current minute, from an hour before to. 400 with the reason for a
// malformed time, a from not before to, or a span longer than
// Backend.HistorySpan (the retention); 503 while the app or its store is
// not running.
func (api *API) history(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(r, "GET")
	}
	b, err := api.backend()
	if err != nil {
		return err
	}
	from, to, err := historyRange(r, b.Now(), b.HistorySpan())
	if err != nil {
		return err
	}
	ans, err := b.History(r.Context(), from, to)
	if err != nil {
		return storeAPIError(err)
	}
	return writeJSON(w, ans)
}

// historyRange reads from and to (RFC 3339), aligned to whole minutes,
// defaulting as history says; longest is the longest span allowed.
func historyRange(r *http.Request, now time.Time, longest time.Duration) (from, to time.Time, err error) {
	q := r.URL.Query()
	parse := func(name string, def time.Time) (time.Time, error) {
		v := q.Get(name)
		if v == "" {
			return def, nil
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return time.Time{}, BadInput("%s must be an RFC 3339 time (2026-12-01T10:00:00Z), got %q", name, v)
		}
		return t.UTC(), nil
	}
	if to, err = parse("to", now.UTC().Truncate(adminapi.HistoryStep).Add(adminapi.HistoryStep)); err != nil {
		return
	}
	if t := to.Truncate(adminapi.HistoryStep); !t.Equal(to) {
		to = t.Add(adminapi.HistoryStep)
	}
	if from, err = parse("from", to.Add(-defaultHistorySpan)); err != nil {
		return
	}
	from = from.Truncate(adminapi.HistoryStep)
	switch {
	case !from.Before(to):
		err = BadInput("from (%s) must be before to (%s)", from.Format(time.RFC3339), to.Format(time.RFC3339))
	case to.Sub(from) > longest:
		err = BadInput("from %s to %s spans %s: at most the retention, %s", from.Format(time.RFC3339), to.Format(time.RFC3339), to.Sub(from), longest)
	}
	return
}
