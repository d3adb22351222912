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
// one store, as this process knows them: read from the store (one scan of
// the provider's quarantined records) when first needed and whenever a
// record left quarantine since, then kept by adding what is quarantined.
type quarantineUse struct {
	bytes int64
	known bool
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
	used, ok := quarantineUsed(ctx, st, h.Provider, maxN)
	return !ok || used+recordBytes(rec) <= maxB
}

// quarantineUsed returns the bytes quarantined for provider in st,
// reading them from the store if they are not known; ok is false if they
// could not be read (the count cap still holds).
func quarantineUsed(ctx context.Context, st store.Store, provider string, limit int) (int64, bool) {
	k := quarantineKey{st, provider}
	quarantineUsage.Lock()
	u := quarantineUsage.m[k]
	if u != nil && u.known {
		defer quarantineUsage.Unlock()
		return u.bytes, true
	}
	quarantineUsage.Unlock()
	recs, err := st.List(ctx, store.Filter{Provider: provider, State: store.StateQuarantined}, max(limit, 1))
	if err != nil {
		return 0, false
	}
	var n int64
	for _, r := range recs {
		n += recordBytes(r)
	}
	quarantineUsage.Lock()
	defer quarantineUsage.Unlock()
	quarantineUsage.m[k] = &quarantineUse{bytes: n, known: true}
	quarantineBytes.WithLabelValues(provider).Set(float64(n))
	return n, true
}

// noteQuarantined adds a newly quarantined record to its provider's bytes.
func noteQuarantined(st store.Store, rec *store.Record) {
	quarantineUsage.Lock()
	defer quarantineUsage.Unlock()
	if u := quarantineUsage.m[quarantineKey{st, rec.Provider}]; u != nil && u.known {
		u.bytes += recordBytes(rec)
		quarantineBytes.WithLabelValues(rec.Provider).Set(float64(u.bytes))
	}
}

// quarantineChanged notes that records of provider left quarantine (or
// expired) in st: its bytes are read again when next needed.
func quarantineChanged(st store.Store, provider string) {
	quarantineUsage.Lock()
	defer quarantineUsage.Unlock()
	if u := quarantineUsage.m[quarantineKey{st, provider}]; u != nil {
		u.known = false
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
