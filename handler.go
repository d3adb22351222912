package pingback

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults of the handler's configuration.
const (
	DefaultAckTimeout = 2 * time.Second
	DefaultMaxBody    = 64 << 10
)

// Handler receives a provider's pingback, stores it durably before
// answering, deduplicates re-deliveries and forwards the original request to
// the next handler (normally reverse_proxy to the app).
//
// The provider gets 200 "OK" once the result is committed, whatever the
// app answers, within AckTimeout counted from the end of the request body
// (its last byte; a GET's arrival), however long the upload took; a commit
// slower than that gets 503 "result not stored" at AckTimeout, and the
// result, once committed, is delivered all the same. How long the upload
// may take is bounded by the server's read timeouts (Caddy's timeouts
// read_body and read_body_idle), not by AckTimeout. Invalid pingbacks get
// 400, 405, 413 or 415 with a short plain-text reason and change nothing.
// If the store cannot commit, the request is still forwarded and the
// provider gets 200 only if the app accepted it, else 503 (but the
// pingback of a pending task this Caddy polls gets 503 "result not stored"
// and is not forwarded: the poller fetches its result once the store is
// back, so it reaches the app once); when Verify or
// UnknownIDs needs the store and it cannot read the pingback's task (down,
// restarting), the provider gets 503 "result not stored" and nothing is
// forwarded or quarantined (a tracked task is polled once the store is
// back). At start-up, a pingback that arrives while the pingback app
// still opens the store waits for it, up to AckTimeout counted from the
// end of its body; if that runs out first, the provider gets 503 "result
// not stored" at AckTimeout, nothing is stored, and the request is
// forwarded without durability (not at all when verify or unknown_ids
// needs the store), as when the store is down.
//
// The app receives the request exactly as the provider sent it plus the
// headers Idempotency-Key, X-Pingback-Source and X-Pingback-Attempt. A 2xx or
// 3xx answer (or none) is a delivery; a transport error, 5xx, 408 or 429 is
// a retryable failure for the replay loop; any other 4xx is rejected and
// kept in the dead-letter queue without automatic retries.
type Handler struct {
	// The solving service that calls this route: captchaai, 2captcha,
	// rucaptcha, anticaptcha, capmonster or capsolver. Required. It decides
	// the task id format (1 to 32 digits; capsolver: UUID-style strings),
	// the callback forms taken (form fields id and code; JSON for the
	// providers with a JSON API) and is half of the deduplication key.
	Provider string `json:"provider,omitempty"`

	// Longest time the provider waits for its answer, counted from the
	// end of the request body (its last byte; a GET's arrival): a slow
	// upload does not count against it. When the app is slower, the
	// provider gets 200 "OK" at this point and the forward's outcome is
	// recorded when it finishes; when the commit is slower, 503 "result
	// not stored" (the result is delivered once committed). The
	// anti-captcha family drops the connection at 2 seconds
	// (https://docs.capmonster.cloud/docs/api/methods/create-task).
	// Default: 1s for anticaptcha and capmonster, 2s for the others.
	AckTimeout caddy.Duration `json:"ack_timeout,omitempty"`

	// Largest accepted request body, in bytes; larger ones get 413.
	// At most 524288 (512 KiB), what every store can keep with the
	// request's headers. Default: 65536 (64 KiB).
	MaxBody int64 `json:"max_body,omitempty"`

	// Request headers kept with the stored result besides the ones a
	// replay needs (StoredHeaders: Accept, Accept-Encoding,
	// Content-Encoding, Content-Length, Content-Type, Forwarded,
	// User-Agent, X-Forwarded-For, X-Forwarded-Host, X-Forwarded-Proto,
	// X-Real-Ip), so that replays carry them too; the live delivery always
	// carries every header. Names are case-insensitive. Credential headers
	// kept this way (Authorization, Cookie, X-Api-Key and the like) are
	// stored, but the admin API shows them as "[redacted]". Default: none.
	KeepHeaders []string `json:"keep_headers,omitempty"`

	// How a pingback is verified before it is delivered: "token" (it must
	// carry its task's pingback token, which pingback_track adds to each
	// submission's pingback URL), "res_php" (its code is confirmed with
	// one result request to the provider, res.php or getTaskResult; needs
	// the provider's api_key) or "none". A pingback that fails is kept in
	// quarantine (state quarantined), not delivered, and the provider
	// still gets 200. Tasks without a token are confirmed as with res_php
	// when the key of the task's account is in the provider's api_key,
	// else accepted (quarantined with res_php: nothing can verify them). Default: token for
	// a provider that has a pingback_track in this config, none otherwise.
	Verify string `json:"verify,omitempty"`

	// What becomes of a pingback whose task id no submission produced:
	// "accept" (delivered, X-Pingback-Tracked: false), "quarantine" (kept,
	// not delivered, released by hand) or "reject" (answered 404, nothing
	// stored; one that arrives while a submission through pingback_track
	// is in flight is quarantined instead, and delivered once its task
	// commits). Default: quarantine for a provider that has a
	// pingback_track in this config, accept otherwise.
	UnknownIDs string `json:"unknown_ids,omitempty"`

	// Most quarantined results kept for the provider, and most bytes of
	// them (request body, headers, URI and code); past either, an
	// untrusted pingback is answered 200 and not stored (counted as
	// callbacks_total{result="quarantine_full"}; a tracked task is still
	// polled). Defaults: 10000 and 67108864 (64 MiB).
	MaxQuarantine      int   `json:"max_quarantine,omitempty"`
	MaxQuarantineBytes int64 `json:"max_quarantine_bytes,omitempty"`

	resolved *handlerModes // Verify and UnknownIDs with the defaults resolved ([Handler.judge])

	app      *App
	provider provider
	logger   *zap.Logger
	// stored is the callbacks counter of this provider's stored results,
	// resolved once (the hot path's counter).
	stored prometheus.Counter
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.pingback",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets defaults and finds the pingback app.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	if h.MaxBody == 0 {
		h.MaxBody = DefaultMaxBody
	}
	var err error
	if h.KeepHeaders, err = canonicalHeaderNames(h.KeepHeaders); err != nil {
		return err
	}
	h.provider, h.app, err = provisionProvider(ctx, h.Provider)
	if err != nil {
		return err
	}
	if h.AckTimeout == 0 {
		h.AckTimeout = caddy.Duration(cmp.Or(h.provider.AckTimeout, DefaultAckTimeout))
	}
	if err := h.provisionVerify(); err != nil {
		return err
	}
	h.stored = h.app.metrics.callbacks.WithLabelValues(h.Provider, "stored")
	return nil
}

// Validate checks the configuration.
func (h *Handler) Validate() error {
	if h.AckTimeout <= 0 {
		return fmt.Errorf("ack_timeout must be positive, got %s", time.Duration(h.AckTimeout))
	}
	if h.MaxBody <= 0 || h.MaxBody > store.MaxBodySize {
		return fmt.Errorf("max_body must be between 1 and %d bytes (what the store can always keep), got %d", store.MaxBodySize, h.MaxBody)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler. A live pingback goes
// through named phases, each on the exchange that holds the request's
// state: receive (parse and build the record), judge (verification and
// quarantine), insert (the durable commit), settle (the cases that end
// without a forward: refusals, duplicates, quarantine) and forward (the
// app through next, then the provider's answer). The provider's answer is
// owned by the exchange's reply, which answers within ack_timeout whatever
// the phases take. A replay the app dispatches in-process re-enters here
// and is only forwarded (serveDispatched).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if d, ok := r.Context().Value(dispatchCtxKey{}).(*dispatch); ok {
		h.serveDispatched(d, r, next)
		return nil
	}
	cb, err := readCallback(w, r, h.provider, h.MaxBody)
	if err != nil {
		return h.refuse(w, err)
	}
	// ack_timeout counts from here, once the whole body is read (a GET's
	// arrival): the provider waits for its answer from its last byte, and
	// a slow upload does not use up the commit's time.
	start := time.Now()
	x := h.receive(r, cb)
	x.deadline = start.Add(time.Duration(h.AckTimeout))
	x.reply.arm(w, time.Until(x.deadline))
	defer x.reply.finish()
	if !x.judge() {
		return nil
	}
	x.insert()
	if x.settle() {
		return nil
	}
	x.forward(next)
	return nil
}

// serveDispatched forwards a stored result the app dispatched in-process
// (a replay or a polled result): it is already stored, so it is only
// forwarded and its outcome reported. A probe only asks whether this
// route reaches a pingback handler.
func (h *Handler) serveDispatched(d *dispatch, r *http.Request, next caddyhttp.Handler) {
	d.reached = true
	if !d.probe {
		stripToken(r)
		d.out = forward(r, next)
	}
}

// refuse answers a request that readCallback did not take: a callback
// that carries no result (200, nothing stored) or a bad request (its
// status and reason). Any other error is the server's.
func (h *Handler) refuse(w http.ResponseWriter, err error) error {
	var notResult *protocol.NotResultError
	if errors.As(err, &notResult) {
		return h.notResult(w, notResult)
	}
	var bad *badRequest
	if !errors.As(err, &bad) {
		return err
	}
	h.app.countReceived(h.Provider, "invalid")
	return writeText(w, bad.status, bad.reason)
}

// exchange is one live pingback from its receipt to the provider's
// answer: what the phases of ServeHTTP find and decide.
type exchange struct {
	h   *Handler
	r   *http.Request
	ctx context.Context // the request's, not cancelled when the provider hangs up
	cb  callback
	rec *store.Record // what is stored: the request as received, its state
	now time.Time     // when it was received (the app's clock)

	deadline time.Time          // the body's end + ack_timeout (the wall clock): the provider is answered by then
	st       store.Store        // the store, or nil when it is not open
	noStore  error              // why st is nil, when not errStoreUnavailable
	v        trust              // what judge decided
	res      store.InsertResult // what the insert found
	err      error              // the insert's error; nil once the result is stored
	held     bool               // stored queued, not forwarded: the provider is paused (holdIfPaused)

	reply reply
}

// receive builds the exchange and the record of a parsed pingback. The
// key is canonical (no leading zeros, CapSolver's UUIDs in lower case);
// the request is kept and forwarded as sent.
func (h *Handler) receive(r *http.Request, cb callback) *exchange {
	cb.id = h.provider.CanonicalID(cb.id)
	now := h.app.now().UTC()
	rec := &store.Record{
		Provider:   h.Provider,
		ID:         cb.id,
		Code:       cb.code,
		Answer:     cb.answer,
		Source:     store.SourceCallback,
		ReceivedAt: now,
		Server:     serverName(r),
		Request: store.Request{
			Method:     r.Method,
			URI:        r.RequestURI,
			Host:       r.Host,
			Proto:      r.Proto,
			RemoteAddr: r.RemoteAddr,
			LocalAddr:  localAddr(r),
			TLS:        r.TLS != nil,
			// Only the headers a replay needs (storedHeader).
			Header: storedHeader(r.Header, h.KeepHeaders),
			Body:   cb.body,
		},
		Delivery: store.Delivery{
			State:     store.StateForwarding,
			Attempts:  1,
			UpdatedAt: now,
		},
		ExpiresAt: now.Add(time.Duration(h.app.Retention)),
	}
	rec.StartAttempt(store.SourceCallback, now) // in the insert: no write of its own
	return &exchange{h: h, r: r, ctx: context.WithoutCancel(r.Context()), cb: cb, rec: rec, now: now}
}

// judge waits for the store while the app's Start opens it, up to the
// time left of ack_timeout, verifies the pingback (verify, unknown_ids)
// against the store and admits a pingback to quarantine. It reports false
// when the provider has been answered and nothing more is to be done: no
// store to verify against (not open, or the read of the pingback's task
// failed: 503, not quarantined), an unknown id refused (404), or a full
// quarantine (200, not stored). When ack_timeout runs out while the store
// is still opening, the provider is answered 503 "result not stored" then
// and there, and the pingback goes on like one the store could not take.
func (x *exchange) judge() bool {
	h := x.h
	var opening bool
	x.st, opening = h.app.storeWithin(time.Until(x.deadline))
	if opening {
		x.noStore = errStoreOpening
		x.reply.expire()
	}
	x.v = trust{verified: VerifyNone}
	if x.st != nil {
		ctx, cancel := x.ackContext()
		x.v = h.judge(ctx, x.st, x.r, x.rec.Key())
		cancel()
	} else if verify, unknown := h.modes(); verify != VerifyNone || unknown != UnknownAccept {
		x.v.storeErr = errStoreUnavailable
		if x.noStore != nil {
			x.v.storeErr = x.noStore
		}
	}
	if x.v.storeErr != nil {
		// No store to verify against (not open, or the read of the
		// pingback's task failed: a restart, a failover): an unverified
		// pingback is never forwarded, and the store's failure is no
		// verdict on the pingback, so it is not quarantined either. The
		// provider may retry; a tracked task is polled once the store is
		// back.
		h.app.countReceived(h.Provider, "store_error")
		if x.st == nil || h.app.logStoreError(h.Provider) {
			h.logger.Error("result NOT stored and not forwarded: the store is not open or cannot read the pingback's task, so the pingback cannot be verified (further ones are counted in a summary line each minute)",
				zap.String("provider", h.Provider), zap.String("id", x.cb.id), zap.Error(x.v.storeErr))
		}
		x.reply.send(http.StatusServiceUnavailable, "result not stored")
		return false
	}
	if x.v.reject {
		h.app.countReceived(h.Provider, "unknown_id")
		x.reply.send(http.StatusNotFound, "unknown task id")
		return false
	}
	rec := x.rec
	rec.Verified, rec.Tracked, rec.Quarantine = x.v.verified, x.v.tracked, x.v.why
	if x.v.why != "" {
		rec.Delivery = store.Delivery{State: store.StateQuarantined, UpdatedAt: x.now}
		if x.v.confirm {
			rec.Verified = ""
		}
	}
	if x.st != nil && x.v.why != "" && !h.admitQuarantine(x.ctx, x.st, rec) {
		h.quarantineFull(rec.Key())
		x.reply.send(http.StatusOK, "OK")
		return false
	}
	x.holdIfPaused()
	return true
}

// insert commits the record (its lease taken in the same write unless it
// is quarantined). A trusted pingback (or one to confirm) for a result
// held in quarantine takes its place, the quarantined code kept as
// other_code.
func (x *exchange) insert() {
	if x.st == nil {
		x.err = errStoreUnavailable
		if x.noStore != nil {
			x.err = x.noStore
		}
		return
	}
	if x.rec.State == store.StateForwarding {
		x.rec.Lease.Until = x.now.Add(x.h.app.leaseFor(x.st))
	}
	// The store retries a transient fault only within what is left of
	// ack_timeout (the commit itself is never abandoned).
	ctx, cancel := x.ackContext()
	defer cancel()
	x.res, x.err = x.st.Insert(ctx, x.rec)
	if x.err == nil && supersedes(x.v, x.res.Existing) {
		if _, serr := x.h.app.supersede(x.ctx, x.st, x.rec.Key(), x.rec); serr == nil {
			x.res.Existing = nil
		}
	}
}

// ackContext is the exchange's context with what is left of ack_timeout
// as its deadline: the store retries a transient fault of the task read
// or of the insert only within it. Past it already (a slow open, read or
// verification), there is no deadline to give: Badger refuses a context
// that is done, and the provider was answered by the timer anyway.
func (x *exchange) ackContext() (context.Context, context.CancelFunc) {
	if time.Until(x.reply.deadline) > 0 {
		return context.WithDeadline(x.ctx, x.reply.deadline)
	}
	return x.ctx, func() {}
}

// settle ends the exchange where no forward follows and reports whether
// it did: a result too large to store (413), an untrusted pingback not
// stored (503), a duplicate or conflict (200) and a result stored in
// quarantine (200). A trusted result that could not be stored goes on to
// the forward without durability, loudly; a stored one goes on to its
// forward.
func (x *exchange) settle() bool {
	h, v := x.h, x.v
	switch {
	case errors.Is(x.err, store.ErrTooLarge):
		// Valid, but no store could keep it: the provider is told, and
		// nothing reaches the app.
		h.app.countReceived(h.Provider, "invalid")
		h.logger.Warn("pingback too large to store (headers and body)",
			zap.String("provider", h.Provider), zap.String("id", x.cb.id), zap.Error(x.err))
		x.reply.send(http.StatusRequestEntityTooLarge, "request too large to store")
		return true
	case x.err != nil && v.why != "":
		// Untrusted (or still to confirm): never forwarded unstored.
		h.app.countReceived(h.Provider, "store_error")
		if h.app.logStoreError(h.Provider) {
			h.logger.Error("untrusted pingback NOT stored and not forwarded (further ones are counted in a summary line each minute)",
				zap.String("provider", h.Provider), zap.String("id", x.cb.id), zap.String("reason", v.why), zap.Error(x.err))
		}
		x.reply.send(http.StatusServiceUnavailable, "result not stored")
		return true
	case x.err != nil && v.polled:
		// A pending task this Caddy polls: the poller fetches its result
		// once the store is back, so a forward without durability now
		// would reach the app twice.
		h.app.countReceived(h.Provider, "store_error")
		if h.app.logStoreError(h.Provider) {
			h.logger.Error("result NOT stored and not forwarded: its task is polled once the store is back (further ones are counted in a summary line each minute)",
				zap.String("provider", h.Provider), zap.String("id", x.cb.id), zap.Error(x.err))
		}
		x.reply.send(http.StatusServiceUnavailable, "result not stored")
		return true
	case x.err != nil:
		h.app.countReceived(h.Provider, "store_error")
		if x.st == nil || h.app.logStoreError(h.Provider) {
			h.logger.Error("result NOT stored: forwarding without durability (further ones are counted in a summary line each minute)",
				zap.String("provider", h.Provider), zap.String("id", x.cb.id), zap.Error(x.err))
		}
		return false
	case x.res.Existing != nil:
		x.reply.commit()
		h.app.countReceived(h.Provider, x.settleDuplicate())
		x.reply.send(http.StatusOK, "OK")
		return true
	case v.why != "":
		// Stored in quarantine: the provider is answered 200 (a genuine
		// pingback sent to a stale URL is not retried into a ban), and
		// nothing reaches the app unless it is confirmed or released.
		x.reply.commit()
		x.reply.send(http.StatusOK, "OK")
		x.settleQuarantined()
		return true
	}
	x.reply.commit()
	if x.reply.written() {
		h.logger.Warn("commit slower than ack_timeout: the provider was answered 503; the result is stored and delivered all the same",
			zap.String("provider", h.Provider), zap.String("id", x.cb.id), zap.Duration("ack_timeout", time.Duration(h.AckTimeout)))
	}
	h.app.countReceivedWith(h.stored, "stored")
	if !x.res.SubmittedAt.IsZero() {
		x.rec.Tracked = true // as the store recorded it
		// As the store recorded it too: X-Pingback-Submitted-At, and the
		// delivery's age (history, delivery_age_seconds) counts from it.
		x.rec.SubmittedAt = x.res.SubmittedAt
		// A tracked task: its delay feeds the poller's automatic "after".
		h.app.observeDelay(h.Provider, x.now.Sub(x.res.SubmittedAt), h.logger)
	}
	return false
}

// settleDuplicate handles a re-delivery of a stored result and returns
// its callbacks_total result label: "duplicate" for the same code,
// "quarantined" for an untrusted one with another code (not stored, the
// stored result stands), else "conflict": another code, settled by the
// confirmation under way or by asking the provider, the losing code kept
// as other_code.
func (x *exchange) settleDuplicate() string {
	h, key, code, existing := x.h, x.rec.Key(), x.cb.code, x.res.Existing
	switch {
	case existing.Code == code || existing.PayloadErased:
		// Erased (keep_payload): no code left to compare; the app had
		// the result.
		return "duplicate"
	case x.v.why != "" && !x.v.confirm:
		h.countQuarantinedLog(key, x.v.why)
		return "quarantined"
	case existing.State == store.StateQuarantined && existing.Quarantine == whyConfirming:
		// The confirmation under way settles it (the provider's answer
		// wins).
		h.app.keepOtherCode(x.ctx, x.st, key, code)
		return "conflict"
	}
	h.logger.Warn("re-delivery with a different code: asking the provider which is the result",
		zap.String("provider", h.Provider), zap.String("id", x.cb.id))
	logger := h.logger
	if h.app.startConfirm(key, logger, func(ctx context.Context, st store.Store) {
		h.app.settleConflict(ctx, st, key, code, logger)
	}) == confirmDropped {
		h.app.keepOtherCode(x.ctx, x.st, key, code)
	}
	return "conflict"
}

// settleQuarantined follows up a result just stored in quarantine: one
// to confirm is confirmed with the provider in the background; one
// quarantined as an unknown id is checked again against its task, which
// may have committed since judge looked (a submission in flight), after
// the task's own re-check found no record: each side checks after its
// own write.
func (x *exchange) settleQuarantined() {
	h, key := x.h, x.rec.Key()
	h.app.noteQuarantined(x.st, x.rec)
	if x.v.confirm {
		h.app.countReceivedWith(h.stored, "stored")
		h.app.confirmLater(x.ctx, x.st, key, h.logger)
		return
	}
	h.countQuarantined(key, x.v.why)
	if x.v.why != whyUnknownID {
		return
	}
	if task, err := x.st.GetTask(x.ctx, key); err == nil {
		h.app.recheckHeld(x.ctx, x.st, task)
	}
}

// forward restores the original request for the app, forwards it in this
// goroutine through next (the one delivery path, App.deliver) and
// answers the provider: 200 when the result is stored or the app took
// it, else 503, logged.
func (x *exchange) forward(next caddyhttp.Handler) {
	if x.held && x.heldStored() {
		return // the provider is paused: stored, delivered once resumed
	}
	h, r, body := x.h, x.r, x.cb.body
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	stripToken(r)
	setDeliveryHeaders(r.Header, x.rec, store.SourceCallback, 1)
	stored := x.err == nil
	d := delivery{
		rec:        x.rec,
		src:        store.SourceCallback,
		route:      routeOf(r.Host, r.RequestURI),
		background: true,
		send: func(fctx context.Context) outcome {
			return forward(r.WithContext(fctx), next)
		},
	}
	if stored {
		d.st = x.st
	}
	out := h.app.deliver(x.ctx, d)
	if stored || out.class == delivered {
		x.reply.send(http.StatusOK, "OK")
		return
	}
	x.reply.send(http.StatusServiceUnavailable, "result not stored and not delivered")
	h.logger.Error("result neither stored nor delivered; the provider was answered 503",
		zap.String("provider", h.Provider), zap.String("id", x.cb.id),
		zap.Int("status", out.status), zap.Error(out.err))
}

var errStoreUnavailable = errors.New("store not open")

// errStoreOpening is why a pingback was not stored when ack_timeout ran
// out while the app's Start was still opening the store.
var errStoreOpening = errors.New("store still opening at ack_timeout")

// supersedes reports whether a pingback judged v replaces existing, the
// record already stored under its key: a trusted one (or one to confirm)
// replaces a quarantined record, except that one to confirm never
// replaces a record whose own confirmation is under way (the forgery
// would be delivered on the strength of the genuine code's answer).
func supersedes(v trust, existing *store.Record) bool {
	if existing == nil || existing.State != store.StateQuarantined {
		return false
	}
	if v.confirm {
		return existing.Quarantine != whyConfirming
	}
	return v.why == ""
}

// provisionProvider resolves a handler's provider (required) and finds the
// pingback app.
func provisionProvider(ctx caddy.Context, name string) (provider, *App, error) {
	if name == "" {
		return provider{}, nil, fmt.Errorf("provider is required (one of: %s)", providerNames())
	}
	p, err := lookupProvider(name)
	if err != nil {
		return provider{}, nil, err
	}
	app, err := loadApp(ctx)
	if err != nil {
		return provider{}, nil, err
	}
	app.noteProviderNamed(name) // a provider that can be paused
	return p, app, nil
}

// loadApp returns the config's pingback app for a handler's Provision
// (with the defaults when the config has no global pingback option).
func loadApp(ctx caddy.Context) (*App, error) {
	app, err := ctx.App("pingback")
	if err != nil {
		return nil, fmt.Errorf("loading pingback app: %w", err)
	}
	return app.(*App), nil
}

// reply answers the provider exactly once, within ack_timeout counted from
// the end of the request body, whatever the store and the app do: if the
// commit or the app takes longer, a timer answers meanwhile, 200 once the
// result is committed, else 503 (a result committed after that is still
// delivered, and the provider's retry is a duplicate). Only one of the
// timer and the handler's goroutine ever writes to w, and the handler
// waits for the timer's write before it returns (finish).
type reply struct {
	w         http.ResponseWriter
	deadline  time.Time // when the timer answers
	timer     *time.Timer
	committed atomic.Bool
	once      sync.Once
	done      chan struct{}
}

// arm starts the timer that answers the provider after wait.
func (a *reply) arm(w http.ResponseWriter, wait time.Duration) {
	a.w, a.done, a.deadline = w, make(chan struct{}), time.Now().Add(max(0, wait))
	a.timer = time.AfterFunc(max(0, wait), a.timeout)
}

// timeout is the timer's answer.
func (a *reply) timeout() {
	if a.committed.Load() {
		a.write(http.StatusOK, "OK", true)
		return
	}
	a.write(http.StatusServiceUnavailable, "result not stored", true)
}

// expire answers now what the timer answers at ack_timeout, pushed out at
// once: for a handler that knows ack_timeout has passed and goes on (to a
// forward) after it.
func (a *reply) expire() {
	if a.timer.Stop() {
		a.timeout()
	}
}

// commit tells the timer that the result is committed.
func (a *reply) commit() { a.committed.Store(true) }

// send answers the provider now, unless the timer already did.
func (a *reply) send(status int, body string) {
	if a.timer.Stop() {
		a.write(status, body, false)
	}
}

// finish waits for the timer's answer if the timer fired; the handler
// must not return while the timer may still write.
func (a *reply) finish() {
	if !a.timer.Stop() {
		<-a.done
	}
}

// write answers the provider. With flush the answer is pushed out at once
// (the timer's case: the forward may still take a while); without, it
// leaves with the handler's return, in one write with the headers.
func (a *reply) write(status int, body string, flush bool) {
	a.once.Do(func() {
		defer close(a.done)
		_ = writeText(a.w, status, body)
		if flush {
			_ = http.NewResponseController(a.w).Flush()
		}
	})
}

// written reports whether the answer has been written.
func (a *reply) written() bool {
	select {
	case <-a.done:
		return true
	default:
		return false
	}
}

// serverName names the http app's server that received r.
func serverName(r *http.Request) string {
	if s, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && s != nil {
		return s.Name()
	}
	return ""
}

// localAddr is the server address r came in on, or "".
func localAddr(r *http.Request) string {
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la != nil {
		return la.String()
	}
	return ""
}

// writeText writes a short plain-text answer.
func writeText(w http.ResponseWriter, status int, msg string) error {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(msg)))
	w.WriteHeader(status)
	_, err := io.WriteString(w, msg)
	return err
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
