package store

import (
	"slices"
	"time"
)

// MaxHistory bounds Delivery.History: the first attempt and the last
// MaxHistory-1 are kept, so that a result replayed by hand again and again
// (a parked one, say) never grows its record without bound; Attempt
// numbers show which attempts in between were dropped.
const MaxHistory = 20

// The sources of an attempt (Attempt.Source) besides SourceCallback,
// SourceReplay and SourcePoll. Only the history tells them apart: the
// X-Pingback-Source header and the metrics' source label say replay for
// both.
const (
	// SourceManual: a replay of one result by hand (the admin API's
	// POST /pingback/records/<provider>/<id>/replay, caddy pingback replay).
	SourceManual Source = "manual"
	// SourceBulk: a replay by a bulk replay job (POST /pingback/replays).
	SourceBulk Source = "bulk"
)

// The outcomes of an attempt (Attempt.Outcome).
const (
	OutcomeDelivered   = "delivered"
	OutcomeFailed      = "failed"
	OutcomeRejected    = "rejected"
	OutcomeTimeout     = "timeout"
	OutcomeInterrupted = "interrupted"
)

// Attempt is one forward of a result to the app, in Delivery.History.
type Attempt struct {
	// Attempt is the forward's number, 1 for the first (what
	// X-Pingback-Attempt carried).
	Attempt int `json:"attempt"`
	// Source is callback (the live forward, or the first forward of a
	// pingback that waited for its confirmation or its task's commit),
	// poll (a polled result's first forward), correction (a forward of a
	// corrected result), replay (the replay loop: a retry, or a forward
	// cut by a crash or a reload replayed), manual or bulk: what the app
	// was sent as X-Pingback-Source, except that manual and bulk are sent
	// as replay.
	Source    Source    `json:"source"`
	StartedAt time.Time `json:"started_at"`
	// EndedAt is zero while the forward runs; for an attempt found
	// interrupted (its lease lapsed) it is when that was found.
	EndedAt time.Time `json:"ended_at,omitzero"`
	// Status is the app's HTTP status, 0 when there was none.
	Status int `json:"status"`
	// Outcome is delivered, failed, rejected, timeout or interrupted;
	// empty while the forward runs.
	Outcome string `json:"outcome,omitempty"`
	// Error says what went wrong, if the attempt was not a delivery.
	Error string `json:"error,omitempty"`
}

// StartAttempt appends the start of forward number d.Attempts from src at
// at to d.History, keeping it within MaxHistory (the first attempt and the
// latest ones). Call it after counting the attempt in d.Attempts.
func (d *Delivery) StartAttempt(src Source, at time.Time) {
	// A new array either way: a caller's copy of the delivery (a retried
	// transaction's) keeps its own.
	h := slices.Clip(d.History)
	if len(h) >= MaxHistory {
		h = append([]Attempt{h[0]}, h[len(h)-MaxHistory+2:]...)
	}
	d.History = append(h, Attempt{Attempt: d.Attempts, Source: src, StartedAt: at})
}

// EndAttempt records how forward number attempt ended, if it is the
// latest in d.History and has not ended yet; the entry is copied, so that
// another copy of the delivery keeps its own.
func (d *Delivery) EndAttempt(attempt int, at time.Time, status int, outcome, errText string) {
	n := len(d.History)
	if n == 0 || d.History[n-1].Attempt != attempt || !d.History[n-1].EndedAt.IsZero() {
		return
	}
	h := append([]Attempt(nil), d.History...)
	h[n-1].EndedAt, h[n-1].Status, h[n-1].Outcome, h[n-1].Error = at, status, outcome, errText
	d.History = h
}
