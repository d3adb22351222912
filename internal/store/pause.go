package store

import (
	"context"
	"time"
)

// PauseAll is the Pause.Provider of the pause of every provider. It is a
// pause of its own: it neither replaces nor removes a provider's pause.
const PauseAll = "*"

// Pause holds the deliveries of a provider (or of every provider, with
// Provider PauseAll): its results are still received and stored, but not
// forwarded, until the pause is deleted.
type Pause struct {
	// Provider is the provider's name, or PauseAll.
	Provider string `json:"provider"`
	// Reason is the operator's text, "" for none.
	Reason string `json:"reason"`
	// Since is when the provider was paused (kept when the pause is put
	// again).
	Since time.Time `json:"since"`
	// Until is when the pause ends by itself; zero for none.
	Until time.Time `json:"until,omitzero"`
	// By says who paused: api, cli or console.
	By string `json:"by"`
}

// Due reports whether the pause has an end and it is at or before now.
func (p Pause) Due(now time.Time) bool { return !p.Until.IsZero() && !p.Until.After(now) }

// Pauser keeps the pauses of deliveries, durably, shared by every handle
// on the same data (every instance of a shared database).
type Pauser interface {
	// PutPause stores p: a new pause, or, for a provider already paused,
	// its new Reason and Until (its Since and By are kept). It returns the
	// pause as stored, once durable.
	PutPause(ctx context.Context, p Pause) (Pause, error)

	// DeletePause deletes the pause of provider (PauseAll: only that
	// pause) and returns it, once durable. With dueBy not zero it deletes
	// the pause only if it has an Until at or before dueBy (a timer's
	// resume that a concurrent PutPause may have pushed back). ErrNotFound
	// when there is no such pause.
	DeletePause(ctx context.Context, provider string, dueBy time.Time) (Pause, error)

	// ListPauses returns every pause, ordered by provider.
	ListPauses(ctx context.Context) ([]Pause, error)
}
