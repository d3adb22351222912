package admin

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// record serves /pingback/records/<provider>/<id> (GET, DELETE),
// /pingback/records/<provider>/<id>/replay (POST) and
// /pingback/records/<provider>/<id>/release (POST).
func (api *API) record(w http.ResponseWriter, r *http.Request) error {
	parts := pathSegments(r, "/pingback/records/")
	switch {
	case len(parts) == 2 && parts[0] != "" && parts[1] != "" && r.Method == http.MethodDelete:
		return api.purgeRecord(w, r, canonicalKey(parts[0], parts[1]))
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return api.getRecord(w, r, canonicalKey(parts[0], parts[1]))
	case len(parts) != 3 || (parts[2] != "replay" && parts[2] != "release") || parts[0] == "" || parts[1] == "":
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found: use GET /pingback/records/<provider>/<id> or POST /pingback/records/<provider>/<id>/replay (or /release)")}
	}
	if r.Method != http.MethodPost {
		return methodNotAllowed(r, "POST")
	}
	key := canonicalKey(parts[0], parts[1])
	if parts[2] == "release" {
		return api.release(w, r, key)
	}
	force := false
	if v := r.URL.Query().Get("force"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return BadInput("force must be true or false, got %q", v)
		}
		force = b
	}
	b, err := api.backend()
	if err != nil {
		return err
	}
	rec, err := b.ReplayResult(r.Context(), key, force)
	if errors.Is(err, store.ErrPurged) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("%s was purged: it cannot be replayed", key)}
	}
	return writeActionResult(w, b, key, rec, err)
}

// writeActionResult answers an action on the stored result key (replay,
// release): the record as JSON (200) when err is nil, else 404 when there
// is no such result, 409 with the Conflict's reason, or the store's error
// (storeAPIError).
func writeActionResult(w http.ResponseWriter, b Backend, key store.Key, rec *store.Record, err error) error {
	var conflict Conflict
	switch {
	case errors.Is(err, store.ErrNotFound):
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no stored result %s", key)}
	case errors.As(err, &conflict):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("%s: %w", key, conflict.Err)}
	case err != nil:
		return storeAPIError(err)
	}
	return writeJSON(w, b.PublicRecord(rec))
}

// getRecord answers GET /pingback/records/<provider>/<id>: the stored
// record as JSON (200), 404 for an unknown result, 503 while the store is
// not open.
func (api *API) getRecord(w http.ResponseWriter, r *http.Request, key store.Key) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(r, "GET")
	}
	b, st, err := api.store()
	if err != nil {
		return err
	}
	rec, err := st.Get(r.Context(), key)
	if errors.Is(err, store.ErrPurged) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("%s was purged", key)}
	}
	if errors.Is(err, store.ErrNotFound) {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no stored result %s", key)}
	}
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	if rec.History == nil {
		rec.History = []store.Attempt{} // a list, [] for a result stored before the history was kept
	}
	return writeJSON(w, b.PublicRecord(rec))
}

// listRecords answers GET /pingback/records?provider=&state=&
// received_after=&received_before=&limit=&cursor=: {"records": [...],
// "next_cursor": "..."}, at most limit records (default 100, at most
// 10000) ordered by received time, then provider and id; next_cursor,
// absent on the last page, asks for the next one (cursor=). The times are
// RFC 3339, both exclusive. A page costs what it holds, however many
// results are stored. Bad filters and cursors answer 400.
func (api *API) listRecords(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(r, "GET")
	}
	q := r.URL.Query()
	f := adminapi.ReplayFilter{Provider: q.Get("provider"), State: store.State(q.Get("state")),
		ReceivedAfter: q.Get("received_after"), ReceivedBefore: q.Get("received_before")}
	if err := f.Parse(knownProvider); err != nil {
		return BadInput("%v", err)
	}
	limit, err := listLimit(q)
	if err != nil {
		return err
	}
	lq := store.ListQuery{Provider: f.Provider, State: f.State, ReceivedAfter: exclusiveAfter(f.After()), ReceivedBefore: f.Before(), Limit: limit}
	if c := q.Get("cursor"); c != "" {
		pos, err := decodeRecordCursor(c)
		if err != nil {
			return BadInput("%v", err)
		}
		lq.After = &pos
	}
	b, st, err := api.store()
	if err != nil {
		return err
	}
	page, err := st.ListPage(r.Context(), lq)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	ans := adminapi.RecordsPage{Records: make([]*store.Record, len(page.Records))}
	for i, rec := range page.Records {
		ans.Records[i] = b.PublicRecord(rec)
	}
	if page.Next != nil {
		ans.NextCursor = encodeRecordCursor(*page.Next)
	}
	return writeJSON(w, ans)
}

// exclusiveAfter turns an exclusive lower bound into the store's
// inclusive one.
func exclusiveAfter(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(time.Nanosecond)
}

// release answers POST /pingback/records/<provider>/<id>/release: a
// quarantined result leaves quarantine and is delivered once now, by hand
// (X-Pingback-Source: replay, X-Pingback-Verified: none); the answer is
// the record after the attempt (200), 404 for an unknown result, 409 for
// one that is not quarantined, 503 while the store is unavailable. The
// console's release button calls this handler.
func (api *API) release(w http.ResponseWriter, r *http.Request, key store.Key) error {
	b, err := api.backend()
	if err != nil {
		return err
	}
	rec, err := b.ReleaseResult(r.Context(), key)
	return writeActionResult(w, b, key, rec, err)
}
