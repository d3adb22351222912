package pingback

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/store"
)

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
