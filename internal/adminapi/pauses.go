package adminapi

import (
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Pause is a pause of deliveries as the admin API shows it (GET and POST
// /pingback/pauses, DELETE /pingback/pauses/<provider>, and the pauses
// of GET /pingback/status): {"provider": "captchaai" or "*", "reason":
// "deploy", "since": RFC 3339, "until": RFC 3339 or null, "by": "api",
// "cli" or "console"}.
type Pause struct {
	Provider string     `json:"provider"`
	Reason   string     `json:"reason"`
	Since    time.Time  `json:"since"`
	Until    *time.Time `json:"until"`
	By       string     `json:"by"`
}

// PauseOf is p as the admin API shows it.
func PauseOf(p store.Pause) Pause {
	out := Pause{Provider: p.Provider, Reason: p.Reason, Since: p.Since.UTC(), By: p.By}
	if !p.Until.IsZero() {
		u := p.Until.UTC()
		out.Until = &u
	}
	return out
}

// PausesOf is ps as the admin API shows them: [] when there is none.
func PausesOf(ps []store.Pause) []Pause {
	out := make([]Pause, 0, len(ps))
	for _, p := range ps {
		out = append(out, PauseOf(p))
	}
	return out
}

// PauseRequest is the body of POST /pingback/pauses: the provider's name
// (or "*" for every provider), an optional reason, an optional until (RFC
// 3339, in the future) and an optional by ("api", "cli" or "console";
// default "api").
type PauseRequest struct {
	Provider string `json:"provider"`
	Reason   string `json:"reason,omitempty"`
	Until    string `json:"until,omitempty"`
	By       string `json:"by,omitempty"`
}

// PausesAnswer is the answer of GET /pingback/pauses.
type PausesAnswer struct {
	Pauses []Pause `json:"pauses"`
}

// ResumedAnswer is the answer of DELETE /pingback/pauses/<provider>: the
// pause that was removed.
type ResumedAnswer struct {
	Resumed Pause `json:"resumed"`
}
