package pingback

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// handleRecord serves /pingback/records/<provider>/<id> (GET),
// /pingback/records/<provider>/<id>/replay (POST) and
// /pingback/records/<provider>/<id>/release (POST).
func handleRecord(w http.ResponseWriter, r *http.Request) error {
	parts := pathSegments(r, "/pingback/records/")
	switch {
	case len(parts) == 2 && parts[0] != "" && parts[1] != "" && r.Method == http.MethodDelete:
		return handlePurgeRecord(w, r, canonicalKey(parts[0], parts[1]))
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return handleGetRecord(w, r, canonicalKey(parts[0], parts[1]))
	case len(parts) != 3 || (parts[2] != "replay" && parts[2] != "release") || parts[0] == "" || parts[1] == "":
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: errors.New("not found: use GET /pingback/records/<provider>/<id> or POST /pingback/records/<provider>/<id>/replay (or /release)")}
	}
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use POST", r.Method)}
	}
	key := canonicalKey(parts[0], parts[1])
	if parts[2] == "release" {
		return handleRelease(w, r, key)
	}
	force := false
	if v := r.URL.Query().Get("force"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return badInput("force must be true or false, got %q", v)
		}
		force = b
	}
	a, err := activeApp()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	rec, err := a.redrive(r.Context(), key, force, store.SourceManual)
	switch {
	case errors.Is(err, store.ErrPurged):
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("%s was purged: it cannot be replayed", key)}
	case errors.Is(err, store.ErrNotFound):
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no stored result %s", key)}
	case errors.Is(err, errDelivered):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("%s: %w", key, err)}
	case errors.Is(err, errInFlight), errors.Is(err, errQuarantined):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("%s: %w", key, err)}
	case err != nil:
		return storeAPIError(err)
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(publicRecord(rec))
}

// handleGetRecord answers GET /pingback/records/<provider>/<id>: the
// stored record as JSON (200), 404 for an unknown result, 503 while the
// store is not open.
func handleGetRecord(w http.ResponseWriter, r *http.Request, key store.Key) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET", r.Method)}
	}
	st, err := adminStore()
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
	return writeJSON(w, publicRecord(rec))
}

// handleListRecords answers GET /pingback/records?provider=&state=&
// received_after=&received_before=&limit=&cursor=: {"records": [...],
// "next_cursor": "..."}, at most limit records (default 100, at most
// 10000) ordered by received time, then provider and id; next_cursor,
// absent on the last page, asks for the next one (cursor=). The times are
// RFC 3339, both exclusive. A page costs what it holds, however many
// results are stored. Bad filters and cursors answer 400.
func handleListRecords(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET", r.Method)}
	}
	q := r.URL.Query()
	f := adminapi.ReplayFilter{Provider: q.Get("provider"), State: store.State(q.Get("state")),
		ReceivedAfter: q.Get("received_after"), ReceivedBefore: q.Get("received_before")}
	if err := f.Parse(knownProvider); err != nil {
		return badInput("%v", err)
	}
	limit, err := listLimit(q)
	if err != nil {
		return err
	}
	lq := store.ListQuery{Provider: f.Provider, State: f.State, ReceivedAfter: exclusiveAfter(f.After()), ReceivedBefore: f.Before(), Limit: limit}
	if c := q.Get("cursor"); c != "" {
		pos, err := decodeRecordCursor(c)
		if err != nil {
			return badInput("%v", err)
		}
		lq.After = &pos
	}
	st, err := adminStore()
	if err != nil {
		return err
	}
	page, err := st.ListPage(r.Context(), lq)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	ans := adminapi.RecordsPage{Records: publicRecords(page.Records)}
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

// A cursor is base64url (no padding) of a JSON array [time in Unix ns,
// provider, id]: for records the received time, for tasks the submission
// time. A task cursor of the order before (by provider and id: [provider,
// id]) is refused (400).
func encodeRecordCursor(p store.Position) string { return encodeCursor(p.ReceivedAt, p.Key) }

func decodeRecordCursor(s string) (store.Position, error) {
	at, k, err := decodeCursor(s)
	return store.Position{ReceivedAt: at, Key: k}, err
}

// handleRelease answers POST /pingback/records/<provider>/<id>/release: a
// quarantined result leaves quarantine and is delivered once now, by hand
// (X-Pingback-Source: replay, X-Pingback-Verified: none); the answer is
// the record after the attempt (200), 404 for an unknown result, 409 for
// one that is not quarantined, 503 while the store is unavailable. The
// console's release button calls this handler.
func handleRelease(w http.ResponseWriter, r *http.Request, key store.Key) error {
	a, err := activeApp()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	rec, err := a.release(r.Context(), key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no stored result %s", key)}
	case errors.Is(err, errNotQuarantined):
		return caddy.APIError{HTTPStatus: http.StatusConflict, Err: fmt.Errorf("%s: %w", key, err)}
	case err != nil:
		return storeAPIError(err)
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(publicRecord(rec))
}

// canonicalKey is the store key of an id given in an admin path: the
// provider's canonical form of it (no leading zeros, CapSolver's UUIDs in
// lower case), or the id as given for an unknown provider or a malformed id.
func canonicalKey(provider, id string) store.Key {
	if p, err := lookupProvider(provider); err == nil && p.ValidID(id) {
		id = p.CanonicalID(id)
	}
	return store.Key{Provider: provider, ID: id}
}
