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
	// Account is the account id (16 hex characters, as /pingback/status
	// and the start-up log show it) of the API key the task was submitted
	// with: one of the provider's configured keys. Optional when the
	// provider has one key (that key's account); required, else 400, when
	// it has several.
	Account string `json:"account,omitempty"`
}

// TasksPage is the answer of GET /pingback/tasks: at most limit tasks,
// and NextCursor (absent on the last page) to ask for the next page with
// cursor=.
type TasksPage struct {
	Tasks      []*store.Task `json:"tasks"`
	NextCursor string        `json:"next_cursor,omitempty"`
}
