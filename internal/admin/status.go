package admin

import (
	"net/http"
)

// status answers GET /pingback/status: the overview (Backend.Status),
// 503 while the app or its store is not running.
func (api *API) status(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(r, "GET")
	}
	b, err := api.backend()
	if err != nil {
		return err
	}
	ans, err := b.Status(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, ans)
}
