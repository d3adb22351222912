package adminapi

import "github.com/caddy-pingback/pingback/internal/store"

// TaskRegistration is the body of POST /pingback/tasks.
type TaskRegistration struct {
	Provider    string `json:"provider"`
	ID          string `json:"id"`
	PingbackURL string `json:"pingback_url"`
	Method      string `json:"method,omitempty"`
	// API is "legacy" (in.php; the default for providers that have it) or
	// "json" (createTask; the default for JSON-only providers).
	API string `json:"api,omitempty"`
	// SubmittedAt is an RFC 3339 time; empty is now.
	SubmittedAt string `json:"submitted_at,omitempty"`
}

// TasksPage is the answer of GET /pingback/tasks: at most limit tasks,
// and NextCursor (absent on the last page) to ask for the next page with
// cursor=.
type TasksPage struct {
	Tasks      []*store.Task `json:"tasks"`
	NextCursor string        `json:"next_cursor,omitempty"`
}
