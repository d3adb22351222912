package pingback

import (
	"fmt"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Headers that tell the app how old a result is, on every delivery (live,
// polled, replayed, corrected, by hand), set by setDeliveryHeaders after
// it removed the request's own X-Pingback-* headers. A reCAPTCHA or
// Turnstile token dies about 120 s after it is issued (docs/protocols.md):
// with these the app can tell a result still worth using.
const (
	// HeaderReceivedAt is when the plugin received the result
	// (Record.ReceivedAt: the pingback, or the poll that fetched it), in
	// RFC 3339 UTC with milliseconds (ageHeaderLayout).
	HeaderReceivedAt = "X-Pingback-Received-At"
	// HeaderSubmittedAt is when the result's task was submitted
	// (Record.SubmittedAt), in the same layout; sent only when the task
	// was tracked (pingback_track or POST /pingback/tasks).
	HeaderSubmittedAt = "X-Pingback-Submitted-At"
)

// ageHeaderLayout is the layout of HeaderReceivedAt and HeaderSubmittedAt:
// RFC 3339 with milliseconds, always three digits, in UTC ("Z").
const ageHeaderLayout = "2006-01-02T15:04:05.000Z07:00"

// expiredMaxAge is the Delivery.ExpiredReason of a result that was older
// than its provider's max_age when a replay or its polled delivery was
// due.
const expiredMaxAge = "max_age"

// maxAgeExpired counts results expired (store.StateExpired) by provider
// and reason (max_age).
var maxAgeExpired = newCounterVec("expired_total", []string{"provider", "reason"},
	"Results kept but not forwarded because they were too old when a replay or their polled delivery was due, by provider and reason (max_age); list them with GET /pingback/records?state=expired.")

// setAgeHeaders sets HeaderReceivedAt, and HeaderSubmittedAt for a
// tracked task, from rec.
func setAgeHeaders(h http.Header, rec *store.Record) {
	h.Set(HeaderReceivedAt, rec.ReceivedAt.UTC().Format(ageHeaderLayout))
	if !rec.SubmittedAt.IsZero() {
		h.Set(HeaderSubmittedAt, rec.SubmittedAt.UTC().Format(ageHeaderLayout))
	}
}

// resultBorn is the time a result's age is measured from: its task's
// submission when it was tracked, else its receipt (the earlier of the two
// if a submission is recorded after the receipt, so that an odd record is
// never taken for younger than it is).
func resultBorn(rec *store.Record) time.Time {
	if !rec.SubmittedAt.IsZero() && rec.SubmittedAt.Before(rec.ReceivedAt) {
		return rec.SubmittedAt
	}
	return rec.ReceivedAt
}

// maxAgeOf is the max_age of provider's results (0: none).
func (a *App) maxAgeOf(provider string) time.Duration {
	if pc := a.Providers[provider]; pc != nil {
		return time.Duration(pc.MaxAge)
	}
	return 0
}

// expireIfTooOld is the max_age part of the replay loop's claim policy
// (decide): if rec is older than maxAge at now and the forward that attempt
// number d.Attempts+1 would start is a replay, a polled delivery, or the
// first forward of a pingback received more than maxAge ago (held by a
// pause), it moves d to store.StateExpired with reason max_age, and
// reports so. The first forward of a pingback received within maxAge (one
// that waited for its confirmation or its task's commit: the live
// delivery) is never held back. Pure, as a claim's Decide must be.
func expireIfTooOld(rec *store.Record, d *store.Delivery, maxAge time.Duration, now time.Time) bool {
	if maxAge <= 0 || now.Sub(resultBorn(rec)) <= maxAge {
		return false
	}
	if sourceFor(rec, d.Attempts+1) == store.SourceCallback && now.Sub(rec.ReceivedAt) <= maxAge {
		// The live delivery of a pingback that waited for its
		// confirmation or its task's commit. One held longer than maxAge
		// since its receipt (a pause) is no longer live: it expires.
		return false
	}
	d.State, d.ExpiredReason = store.StateExpired, expiredMaxAge
	d.DueAt, d.Lease, d.UpdatedAt = time.Time{}, store.Lease{}, now
	return true
}

// noteMaxAgeExpired counts and logs a result the replay loop just expired
// (store.StateExpired, reason max_age); under a flood (a backlog drained
// after a long outage) the lines beyond the first few a minute become one
// summary line per provider.
func (a *App) noteMaxAgeExpired(rec *store.Record) {
	maxAgeExpired.WithLabelValues(rec.Provider, rec.ExpiredReason).Inc()
	h := a.readyHandle()
	if h != nil {
		h.noteExpired()
	}
	if h == nil || !h.expired.allow(rec.Provider) {
		return
	}
	since := "received"
	if resultBorn(rec).Equal(rec.SubmittedAt) {
		since = "submitted"
	}
	a.logger.Warn("result expired: older than its provider's max_age when it was due; kept, not forwarded (replay it by hand to deliver it all the same; further ones are counted in a summary line each minute)",
		zap.String("key", rec.Key().String()), zap.String("age_since", since),
		zap.Duration("age", rec.UpdatedAt.Sub(resultBorn(rec))), zap.Duration("max_age", a.maxAgeOf(rec.Provider)))
}

// newExpiredLog is the store handle's throttled log of results expired
// for max_age, by provider.
func newExpiredLog() *throttledLog {
	return newThrottledLog(20, 100, "results expired in the last minute: older than their provider's max_age; kept, not forwarded")
}

// validateMaxAge checks the provider block's max_age: none (0) or
// positive.
func (pc *ProviderConfig) validateMaxAge(name string) error {
	if pc.MaxAge < 0 {
		return fmt.Errorf("provider %s: max_age must be positive, got %s", name, time.Duration(pc.MaxAge))
	}
	return nil
}
