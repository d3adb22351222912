package adminapi

import (
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// DeadLetters is the answer of GET /pingback/deadletters: the results
// that need a person (parked, rejected, failed) grouped by what went
// wrong, as Hookdeck's "issues" group failed events.
type DeadLetters struct {
	// Groups are the groups, the most recently seen first; [] when none.
	Groups []DeadLetterGroup `json:"groups"`
	// Scanned is how many records were read to build Groups.
	Scanned int `json:"scanned"`
	// Truncated reports that the scan stopped at its bound (10,000
	// records): the counts are then lower bounds.
	Truncated bool `json:"truncated"`
}

// DeadLetterGroup is the results of one route, provider, state and last
// error in DeadLetters.
type DeadLetterGroup struct {
	// Route is the host and path the results are forwarded to
	// ("app.example/cb"), as in StatusAnswer.Routes.
	Route    string      `json:"route"`
	Provider string      `json:"provider"`
	State    store.State `json:"state"`
	// Error is the results' last_error ("" when none was recorded).
	Error string `json:"error"`
	Count int    `json:"count"`
	// FirstSeen and LastSeen are the earliest and the latest of the
	// results' last failure times (the end of their last attempt that was
	// not a delivery; their last update when no attempt is recorded).
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}
