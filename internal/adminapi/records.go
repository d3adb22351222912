package adminapi

import "github.com/caddy-pingback/pingback/internal/store"

// RecordsPage is the answer of GET /pingback/records: at most limit
// records, and NextCursor (absent on the last page) to ask for the next
// page with cursor=.
type RecordsPage struct {
	Records    []*store.Record `json:"records"`
	NextCursor string          `json:"next_cursor,omitempty"`
}

// PurgeAnswer is the answer of both purge routes (DELETE
// /pingback/records/<provider>/<id> and POST /pingback/purges): how many
// stored results were erased.
type PurgeAnswer struct {
	Purged int `json:"purged"`
}
