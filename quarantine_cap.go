package pingback

import (
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
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

var quarantineUsage = struct {
	sync.Mutex
	m map[quarantineKey]*quarantineUse
}{m: map[quarantineKey]*quarantineUse{}}

type quarantineKey struct {
	st       store.Store
	provider string
}

// quarantineBytes is the gauge of quarantined bytes per provider.
var quarantineBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Namespace: "caddy", Subsystem: "pingback", Name: "quarantine_bytes",
	Help: "Bytes of quarantined pingbacks (request body, headers, URI, code) held per provider, capped by max_quarantine.",
}, []string{"provider"})

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

// quarantineUsed returns the bytes quarantined for provider in st: read
// from the store if they were never read (one read, which concurrent
// callers wait for), the last known bytes otherwise, with a read started
// in the background if they are stale; ok is false if they could not be
// read (the count cap still holds).
func (a *App) quarantineUsed(st store.Store, provider string, limit int) (int64, bool) {
	k := quarantineKey{st, provider}
	quarantineUsage.Lock()
	u := quarantineUsage.m[k]
	if u == nil {
		u = &quarantineUse{}
		quarantineUsage.m[k] = u
	}
	u.limit = max(u.limit, limit)
	switch {
	case u.known:
		if u.stale && u.reading == nil {
			done := u.startRead()
			if !a.startBackground(func(ctx context.Context, _ store.Store) { readQuarantineBytes(ctx, k, limit, done) }) {
				u.reading, u.stale = nil, true
				close(done)
			}
		}
		defer quarantineUsage.Unlock()
		return u.bytes, true
	case u.reading != nil:
		done := u.reading
		quarantineUsage.Unlock()
		<-done
	default:
		done := u.startRead()
		quarantineUsage.Unlock()
		readQuarantineBytes(a.loopCtx, k, limit, done)
	}
	quarantineUsage.Lock()
	defer quarantineUsage.Unlock()
	return u.bytes, u.known
}

// startRead marks a read under way and returns its done channel; the
// caller holds quarantineUsage.
func (u *quarantineUse) startRead() chan struct{} {
	u.reading, u.stale, u.added = make(chan struct{}), false, 0
	return u.reading
}

// readQuarantineBytes reads the bytes of k's quarantined records from the
// store, then closes done. What was quarantined while it read is added
// (it may be counted twice until the next read: the cap errs on the side
// of the disk).
func readQuarantineBytes(ctx context.Context, k quarantineKey, limit int, done chan struct{}) {
	recs, err := k.st.List(ctx, store.Filter{Provider: k.provider, State: store.StateQuarantined}, max(limit, 1))
	var n int64
	for _, r := range recs {
		n += recordBytes(r)
	}
	quarantineUsage.Lock()
	defer quarantineUsage.Unlock()
	defer close(done)
	u := quarantineUsage.m[k]
	if u.reading == done {
		u.reading = nil
	}
	if err != nil {
		u.stale = true // read again when next needed
		return
	}
	u.bytes, u.known = n+u.added, true
	quarantineBytes.WithLabelValues(k.provider).Set(float64(u.bytes))
}

// quarantinePurged reads again, now, the bytes of the quarantined records
// of provider (every provider this process knows if "") in st, after a
// purge: a quarantine emptied by hand takes pingbacks again at once.
func quarantinePurged(ctx context.Context, st store.Store, provider string) {
	quarantineChanged(st, provider)
	var keys []quarantineKey
	quarantineUsage.Lock()
	for k, u := range quarantineUsage.m {
		if k.st == st && (provider == "" || k.provider == provider) && u.reading == nil {
			keys = append(keys, k)
		}
	}
	dones := make([]chan struct{}, len(keys))
	limits := make([]int, len(keys))
	for i, k := range keys {
		dones[i], limits[i] = quarantineUsage.m[k].startRead(), quarantineUsage.m[k].limit
	}
	quarantineUsage.Unlock()
	for i, k := range keys {
		readQuarantineBytes(ctx, k, limits[i], dones[i])
	}
}

// noteQuarantined adds a newly quarantined record to its provider's bytes.
func noteQuarantined(st store.Store, rec *store.Record) {
	quarantineUsage.Lock()
	defer quarantineUsage.Unlock()
	u := quarantineUsage.m[quarantineKey{st, rec.Provider}]
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
func quarantineChanged(st store.Store, provider string) {
	quarantineUsage.Lock()
	defer quarantineUsage.Unlock()
	for k, u := range quarantineUsage.m {
		if k.st == st && (provider == "" || k.provider == provider) {
			u.stale = true
		}
	}
}

// quarantineFull counts and logs (throttled) a pingback that was not
// quarantined because the quarantine is full.
func (h *Handler) quarantineFull(key store.Key) {
	h.app.metrics.callbacks.WithLabelValues(h.Provider, "quarantine_full").Inc()
	if quarantineLog.allow(h.Provider) {
		h.logger.Warn("quarantine full (max_quarantine): an untrusted pingback was answered 200 and NOT stored; a tracked task is still polled",
			zap.String("key", key.String()), zap.Int("max_records", h.MaxQuarantine), zap.Int64("max_bytes", h.MaxQuarantineBytes))
	}
}
