package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// purgeRecord answers DELETE /pingback/records/<provider>/<id>.
func (api *API) purgeRecord(w http.ResponseWriter, r *http.Request, key store.Key) error {
	b, st, err := api.store()
	if err != nil {
		return err
	}
	n, err := st.Purge(r.Context(), store.PurgeQuery{Keys: []store.Key{key}})
	if err != nil {
		return storeAPIError(err)
	}
	if n > 0 {
		b.PurgedResults(r.Context(), st, key.Provider) // the quarantine cap's bytes, read again
	}
	if n == 0 {
		if _, err := st.Get(r.Context(), key); errors.Is(err, store.ErrPurged) {
			return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("%s: already purged", key)}
		}
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("no stored result %s", key)}
	}
	logPurge(n, zap.String("key", key.String()))
	return writeJSON(w, adminapi.PurgeAnswer{Purged: n})
}

// purges answers POST /pingback/purges.
//
// Purge (the right to erasure) on the admin API:
//
//	DELETE /pingback/records/<provider>/<id>   erase one stored result
//	POST   /pingback/purges                    erase every result a JSON filter matches
//
// Both are synchronous and answer {"purged": n} (200). DELETE of a result
// that is not stored (or already purged) answers 404. The filter of POST
// is {"provider", "state", "received_after", "received_before"} (RFC 3339
// times, both exclusive), with no default state and at least one field,
// else 400.
//
// A purged result is erased with its task whatever its state, a forward
// in flight included (that forward ends and finds nothing to record). A
// key-only tombstone stays until the result's retention ends: a re-sent
// pingback or a late poll of it is a duplicate (answered 200, not
// forwarded), GET and replay answer 404 saying it was purged, and it is
// never listed again. On Badger the bytes are gone from the store's files
// when the answer comes; on PostgreSQL the row is deleted and its bytes
// remain in dead tuples until VACUUM (see the store's Purge).
func (api *API) purges(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return methodNotAllowed(r, "POST")
	}
	f, err := decodeFilter(r, "")
	if err != nil {
		return err
	}
	q := store.PurgeQuery{Provider: f.Provider, State: f.State, ReceivedAfter: exclusiveAfter(f.After()), ReceivedBefore: f.Before()}
	if !q.Filtered() {
		return BadInput("a purge needs at least one of provider, state, received_after and received_before")
	}
	b, st, err := api.store()
	if err != nil {
		return err
	}
	n, err := st.Purge(r.Context(), q)
	if err != nil {
		return storeAPIError(err)
	}
	if n > 0 {
		b.PurgedResults(r.Context(), st, f.Provider) // "" for every provider
	}
	logPurge(n, zap.String("provider", f.Provider), zap.String("state", string(f.State)),
		zap.String("received_after", f.ReceivedAfter), zap.String("received_before", f.ReceivedBefore))
	return writeJSON(w, adminapi.PurgeAnswer{Purged: n})
}

// logPurge logs a purge (never what was erased, only how it was chosen).
func logPurge(n int, fields ...zap.Field) {
	caddy.Log().Named("pingback").Info("results purged", append(fields, zap.Int("purged", n))...)
}

// decodeFilter reads the JSON filter of a bulk replay or a purge from the
// body of r (at most 64 KiB, no unknown fields; an empty body is no
// filter), with state defaulting to defaultState; a bad one is a 400.
func decodeFilter(r *http.Request, defaultState store.State) (adminapi.ReplayFilter, error) {
	var f adminapi.ReplayFilter
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil && err != io.EOF {
		return f, BadInput("decoding JSON body: %v", err)
	}
	if f.State == "" {
		f.State = defaultState
	}
	if err := f.Parse(knownProvider); err != nil {
		return f, BadInput("%v", err)
	}
	return f, nil
}
