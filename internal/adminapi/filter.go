package adminapi

import (
	"fmt"
	"slices"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// ReplayFilter selects the results of a bulk replay, a purge or a list of
// records: the JSON body of POST /pingback/replays and POST
// /pingback/purges, and the query of GET /pingback/records.
type ReplayFilter struct {
	Provider string      `json:"provider,omitempty"`
	State    store.State `json:"state,omitempty"`
	// ReceivedAfter and ReceivedBefore bound the results' received_at
	// (RFC 3339), both exclusive.
	ReceivedAfter  string `json:"received_after,omitempty"`
	ReceivedBefore string `json:"received_before,omitempty"`

	after, before time.Time
}

// Parse checks f and fills in its times (After, Before): knownProvider
// judges a non-empty Provider (its error is returned as it is), State must
// be one of store.States or empty, and the times RFC 3339 or empty.
func (f *ReplayFilter) Parse(knownProvider func(name string) error) error {
	if f.Provider != "" {
		if err := knownProvider(f.Provider); err != nil {
			return err
		}
	}
	if f.State != "" && !slices.Contains(store.States, f.State) {
		return fmt.Errorf("unknown state %q (queued, forwarding, delivered, failed, rejected, parked, quarantined or expired)", f.State)
	}
	for _, x := range []struct {
		name string
		v    string
		t    *time.Time
	}{{"received_after", f.ReceivedAfter, &f.after}, {"received_before", f.ReceivedBefore, &f.before}} {
		if x.v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, x.v)
		if err != nil {
			return fmt.Errorf("%s must be an RFC 3339 time: %v", x.name, err)
		}
		*x.t = t
	}
	return nil
}

// After is ReceivedAfter as Parse read it; the zero time when unset.
func (f *ReplayFilter) After() time.Time { return f.after }

// Before is ReceivedBefore as Parse read it; the zero time when unset.
func (f *ReplayFilter) Before() time.Time { return f.before }

// Matches reports whether rec is within f's received range (after Parse).
func (f *ReplayFilter) Matches(rec *store.Record) bool {
	return (f.after.IsZero() || rec.ReceivedAt.After(f.after)) && (f.before.IsZero() || rec.ReceivedAt.Before(f.before))
}
