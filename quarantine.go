package pingback

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// The quarantine is capped per provider, in records and in bytes, so that
// a flood of forged pingbacks cannot fill the disk: past the cap a
// pingback that would be quarantined is answered 200 and not stored
// (counted as callbacks{result="quarantine_full"}). A genuine pingback
// lost that way is not lost for good: its task stays pending and the
// poller fetches the result.
const (
	// DefaultMaxQuarantine is the default most quarantined records per
	// provider.
	DefaultMaxQuarantine = 10000
	// DefaultMaxQuarantineBytes is the default most bytes of quarantined
	// records per provider (request body, headers, URI and code).
	DefaultMaxQuarantineBytes = 64 << 20
)

// quarantineUse is the bytes of one provider's quarantined records in
// one store, as this process knows them: kept by adding what is
// quarantined, and read from the store (one scan of the provider's
// quarantined records) once when first needed (concurrent pingbacks wait
// for that one read), again in the background after records left
// quarantine or expired (stale: meanwhile the last known bytes apply, an
// over-estimate), and at once, in the admin request, after a purge. A
// read never runs twice at once for one provider and store, and never
// again inside a pingback's request once the bytes are known.
type quarantineUse struct {
	bytes   int64
	known   bool          // read from the store at least once
	stale   bool          // records left quarantine since the last read
	reading chan struct{} // a read under way, closed when it ends; nil if none
	added   int64         // bytes quarantined while reading
	limit   int           // the most records a read lists (max_quarantine)
}

// quarantineUsage is the quarantineUse of each provider in one store
// (storeHandle.quarantine): shared by every config on the store, so a
// reload keeps what is known.
type quarantineUsage struct {
	mu sync.Mutex
	m  map[string]*quarantineUse // by provider
}

// recordBytes is what a quarantined record costs against the cap.
func recordBytes(r *store.Record) int64 {
	n := len(r.Request.Body) + len(r.Request.URI) + len(r.Code) + len(r.Answer)
	for k, vs := range r.Request.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return int64(n)
}

// admitQuarantine reports whether rec may be quarantined under the
// handler's caps: fewer quarantined records than max_quarantine for the
// provider (the store's counts) and room for its bytes.
func (h *Handler) admitQuarantine(ctx context.Context, st store.Store, rec *store.Record) bool {
	maxN, maxB := h.MaxQuarantine, h.MaxQuarantineBytes
	c, err := st.Counts(ctx)
	if err == nil && c.Records[h.Provider][store.StateQuarantined] >= int64(maxN) {
		return false
	}
	used, ok := h.app.quarantineUsed(st, h.Provider, maxN)
	return !ok || used+recordBytes(rec) <= maxB
}

// handleFor returns a's store handle if st is its store (Start has run);
// nil otherwise.
func (a *App) handleFor(st store.Store) *storeHandle {
	if h := a.readyHandle(); h != nil && h.store == st {
		return h
	}
	return nil
}

// quarantineUsed returns the bytes quarantined for provider in st: read
// from the store if they were never read (one read, which concurrent
// callers wait for), the last known bytes otherwise, with a read started
// in the background if they are stale; ok is false if they could not be
// read (the count cap still holds).
func (a *App) quarantineUsed(st store.Store, provider string, limit int) (int64, bool) {
	h := a.handleFor(st)
	if h == nil {
		return 0, false
	}
	q := &h.quarantine
	q.mu.Lock()
	if q.m == nil {
		q.m = map[string]*quarantineUse{}
	}
	u := q.m[provider]
	if u == nil {
		u = &quarantineUse{}
		q.m[provider] = u
	}
	u.limit = max(u.limit, limit)
	switch {
	case u.known:
		if u.stale && u.reading == nil {
			done := u.startRead()
			if !a.startBackground(func(ctx context.Context, _ store.Store) { h.readQuarantineBytes(ctx, provider, limit, done) }) {
				u.reading, u.stale = nil, true
				close(done)
			}
		}
		defer q.mu.Unlock()
		return u.bytes, true
	case u.reading != nil:
		done := u.reading
		q.mu.Unlock()
		<-done
	default:
		done := u.startRead()
		q.mu.Unlock()
		h.readQuarantineBytes(a.loopCtx, provider, limit, done)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return u.bytes, u.known
}

// startRead marks a read under way and returns its done channel; the
// caller holds the quarantineUsage's lock.
func (u *quarantineUse) startRead() chan struct{} {
	u.reading, u.stale, u.added = make(chan struct{}), false, 0
	return u.reading
}

// readQuarantineBytes reads the bytes of provider's quarantined records
// from the store, then closes done. What was quarantined while it read is
// added (it may be counted twice until the next read: the cap errs on the
// side of the disk).
func (h *storeHandle) readQuarantineBytes(ctx context.Context, provider string, limit int, done chan struct{}) {
	recs, err := h.store.List(ctx, store.Filter{Provider: provider, State: store.StateQuarantined}, max(limit, 1))
	var n int64
	for _, r := range recs {
		n += recordBytes(r)
	}
	q := &h.quarantine
	q.mu.Lock()
	defer q.mu.Unlock()
	defer close(done)
	u := q.m[provider]
	if u.reading == done {
		u.reading = nil
	}
	if err != nil {
		u.stale = true // read again when next needed
		return
	}
	u.bytes, u.known = n+u.added, true
	quarantineBytes.WithLabelValues(provider).Set(float64(u.bytes))
}

// quarantinePurged reads again, now, the bytes of the quarantined records
// of provider (every provider this process knows if "") in st, after a
// purge: a quarantine emptied by hand takes pingbacks again at once. st
// is the running config's store (the admin API's): the bytes are those
// its handle knows.
func quarantinePurged(ctx context.Context, st store.Store, provider string) {
	v, err := caddy.ActiveContext().AppIfConfigured("pingback")
	if err != nil {
		return
	}
	if h := v.(*App).handleFor(st); h != nil {
		h.quarantinePurged(ctx, provider)
	}
}

// quarantinePurged is the package function quarantinePurged on h's store.
func (h *storeHandle) quarantinePurged(ctx context.Context, provider string) {
	h.quarantineChanged(provider)
	q := &h.quarantine
	var providers []string
	q.mu.Lock()
	for p, u := range q.m {
		if (provider == "" || p == provider) && u.reading == nil {
			providers = append(providers, p)
		}
	}
	dones := make([]chan struct{}, len(providers))
	limits := make([]int, len(providers))
	for i, p := range providers {
		dones[i], limits[i] = q.m[p].startRead(), q.m[p].limit
	}
	q.mu.Unlock()
	for i, p := range providers {
		h.readQuarantineBytes(ctx, p, limits[i], dones[i])
	}
}

// noteQuarantined adds a newly quarantined record of st to its provider's
// bytes.
func (a *App) noteQuarantined(st store.Store, rec *store.Record) {
	h := a.handleFor(st)
	if h == nil {
		return
	}
	q := &h.quarantine
	q.mu.Lock()
	defer q.mu.Unlock()
	u := q.m[rec.Provider]
	if u == nil {
		return
	}
	if u.reading != nil {
		u.added += recordBytes(rec)
	}
	if u.known {
		u.bytes += recordBytes(rec)
		quarantineBytes.WithLabelValues(rec.Provider).Set(float64(u.bytes))
	}
}

// quarantineChanged notes that records of provider (every provider if
// "") left quarantine, expired or were purged in st: its bytes are read
// again, in the background, when next needed.
func (a *App) quarantineChanged(st store.Store, provider string) {
	if h := a.handleFor(st); h != nil {
		h.quarantineChanged(provider)
	}
}

// quarantineChanged is App.quarantineChanged on h's store.
func (h *storeHandle) quarantineChanged(provider string) {
	q := &h.quarantine
	q.mu.Lock()
	defer q.mu.Unlock()
	for p, u := range q.m {
		if provider == "" || p == provider {
			u.stale = true
		}
	}
}

// quarantineFull counts and logs (throttled) a pingback that was not
// quarantined because the quarantine is full.
func (h *Handler) quarantineFull(key store.Key) {
	h.app.countReceived(h.Provider, "quarantine_full")
	if h.app.logQuarantined(h.Provider) {
		h.logger.Warn("quarantine full (max_quarantine): an untrusted pingback was answered 200 and NOT stored; a tracked task is still polled",
			zap.String("key", key.String()), zap.Int("max_records", h.MaxQuarantine), zap.Int64("max_bytes", h.MaxQuarantineBytes))
	}
}

// logQuarantined reports whether a quarantined (or refused, quarantine
// full) pingback of provider may be logged now: a forgery flood gets 20
// lines a minute and a summary per provider (storeHandle.quarantined).
func (a *App) logQuarantined(provider string) bool {
	h := a.readyHandle()
	return h == nil || h.quarantined.allow(provider)
}

// countQuarantined counts and logs (throttled) a quarantined pingback.
func (h *Handler) countQuarantined(key store.Key, why string) {
	h.app.countReceived(h.Provider, "quarantined")
	h.app.noteQuarantinedEvent(h.Provider)
	h.countQuarantinedLog(key, why)
}

// countQuarantinedLog logs a quarantined pingback, throttled.
func (h *Handler) countQuarantinedLog(key store.Key, why string) {
	if h.app.logQuarantined(h.Provider) {
		h.logger.Warn("pingback quarantined: not delivered (release it by hand if it is genuine; further ones are counted in a summary line each minute)",
			zap.String("key", key.String()), zap.String("reason", why))
	}
}

// supersede replaces a quarantined record under key by next (a verified
// pingback, or the provider's own answer), keeping the quarantined code as
// other_code; the record leaves quarantine, so its task is marked done.
// It returns the record as stored, or store.ErrSkip if the record under
// key is not quarantined (someone settled it first).
func (a *App) supersede(ctx context.Context, st store.Store, key store.Key, next *store.Record) (*store.Record, error) {
	defer a.quarantineChanged(st, key.Provider)
	return st.UpdateRecord(ctx, key, func(cur *store.Record) error {
		if cur.State != store.StateQuarantined {
			return store.ErrSkip
		}
		other := cur.Code
		if other == next.Code {
			other = cur.OtherCode
		}
		*cur = *next
		cur.OtherCode = other
		return nil
	})
}

// release delivers a quarantined result by hand: it leaves quarantine
// (X-Pingback-Verified: none; its task, if any, is done unless the result
// is older than it) and is forwarded once now, as a replay by hand; a
// failed forward is retried like any other. It returns the record after
// the attempt.
func (a *App) release(ctx context.Context, key store.Key) (*store.Record, error) {
	st := a.store(time.Second)
	if st == nil {
		return nil, errStoreUnavailable
	}
	paused := a.refusePaused(key.Provider) // refused once the record is known
	h := a.readyHandle()
	if h == nil || !h.track() {
		return nil, errStoreUnavailable
	}
	defer h.untrack()
	now := a.now().UTC()
	rec, err := st.UpdateRecord(ctx, key, func(r *store.Record) error {
		if r.PayloadErased {
			return errPayloadErased
		}
		if paused != nil {
			return paused
		}
		if r.State != store.StateQuarantined {
			return errNotQuarantined
		}
		// Leased to this process at once, as a claim would: the replay
		// loop never sees it between release and forward.
		r.State, r.UpdatedAt, r.DueAt = store.StateForwarding, now, time.Time{}
		r.Attempts++
		r.StartAttempt(store.SourceManual, now)
		r.Lease = store.Lease{Until: now.Add(a.leaseFor(st))}
		r.Verified = VerifyNone
		return nil
	})
	if err != nil {
		return nil, err
	}
	a.quarantineChanged(st, key.Provider)
	out := a.deliverStored(st, rec, store.SourceReplay, false)
	a.logger.Info("quarantined result released by hand", zap.String("key", key.String()),
		zap.Int("attempt", rec.Attempts), zap.String("outcome", out.class.String()))
	return st.Get(ctx, key)
}

var errNotQuarantined = errors.New("result is not quarantined")

// recheckHeld looks, once a task committed, for a pingback of it that was
// quarantined as an unknown id while its submission was in flight (it
// arrived after the submission entered pingback_track): if it carries the
// task's token (or the handler verifies nothing) it is queued for
// delivery now, verified. A record received before the submission stays
// quarantined, its reason now before_submission: a result older than its
// task never completes it.
func (a *App) recheckHeld(ctx context.Context, st store.Store, t *store.Task) {
	rec, err := st.Get(ctx, t.Key())
	if err != nil || rec.State != store.StateQuarantined || rec.Quarantine != whyUnknownID {
		return
	}
	if rec.ReceivedAt.Before(t.SubmittedAt) {
		a.markQuarantined(ctx, st, t.Key(), whyBeforeSubmission)
		return
	}
	verified := VerifyNone
	if t.Token != "" {
		_, q, _ := strings.Cut(rec.Request.URI, "?")
		if !tokenMatches(q, t.Token) {
			_, _ = st.UpdateRecord(ctx, t.Key(), func(r *store.Record) error {
				if r.State != store.StateQuarantined || r.Quarantine != whyUnknownID {
					return store.ErrSkip
				}
				r.Quarantine, r.Tracked = whyTokenMismatch, true
				return nil
			})
			return
		}
		verified = VerifyToken
	}
	confirm := t.Token == "" && a.taskPollable(t)
	now := a.now().UTC()
	_, err = st.UpdateRecord(ctx, t.Key(), func(r *store.Record) error {
		if r.State != store.StateQuarantined || r.Quarantine != whyUnknownID {
			return store.ErrSkip
		}
		r.Tracked, r.UpdatedAt = true, now
		if confirm {
			r.Quarantine = whyConfirming
			return nil
		}
		r.State, r.DueAt = store.StateQueued, now
		r.Verified = verified
		return nil
	})
	if err == nil && confirm {
		a.confirmLater(ctx, st, t.Key(), a.logger)
		return
	}
	switch {
	case err == nil:
		a.quarantineChanged(st, t.Provider)
		a.logger.Info("pingback held until its task committed: verified, delivering", zap.String("key", t.Key().String()))
		if h := a.readyHandle(); h != nil {
			h.wake()
		}
	case !errors.Is(err, store.ErrSkip):
		a.logger.Warn("re-checking a held pingback failed; it stays quarantined (release it by hand)",
			zap.String("key", t.Key().String()), zap.Error(err))
	}
}

var errQuarantined = errors.New("quarantined: release it (POST /pingback/records/<provider>/<id>/release) to deliver it")
