package pingback

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	caddy.RegisterModule(Tracker{})
}

// DefaultTrackMaxBody is the largest submission the track handler reads to
// learn its parameters; in.php takes images up to about 600 kB, 1.4 MB once
// base64-encoded (ERROR_TOO_BIG_CAPTCHA_FILESIZE,
// https://2captcha.com/2captcha-api#in_errors).
const DefaultTrackMaxBody = 8 << 20

// Tracker sits in front of a reverse_proxy to the provider's API, so the
// plugin learns which tasks the app submits without any change to the app
// (the app points its provider host at this site).
//
// On in.php it forwards the submission unchanged (GET query, urlencoded or
// multipart POST; uploads byte-identical), reads the provider's answer
// (`OK|<id>` or `{"status":1,"request":<id>}`) and records the task as
// pending, then returns the answer to the app unchanged. With PingbackURL
// set, a submission without a `pingback` parameter gets that one added.
//
// On res.php?action=get&id=<id> with the configured api_key of the task's
// account (a result with no task: the provider's only key) it answers from
// the store when the plugin already holds the result (by
// pingback or by its own poll), in the format the app asked for (json=0 or
// json=1; the provider's kept JSON answer byte for byte), without calling
// the provider; otherwise it passes the request through, and a result the
// provider returns is stored, so a later pingback is a duplicate.
//
// On the JSON API (POST .../createTask, .../getTaskResult) it does the same:
// a createTask request is forwarded byte-identical except for an added
// callbackUrl (the last member) when PingbackURL is set and the request
// carries none; its answer's taskId is recorded; a synchronous answer
// (status "ready" with the solution) is stored as a result at once. A
// getTaskResult request with the clientKey of the task's account for a
// result the plugin holds in getTaskResult's shape is answered locally; any other
// request passes through unchanged, and a result seen in its answer is
// stored as delivered.
type Tracker struct {
	// The provider behind this route: captchaai, 2captcha, rucaptcha,
	// anticaptcha, capmonster or capsolver. Required.
	Provider string `json:"provider,omitempty"`

	// Pingback URL added to submissions that carry none (in.php's
	// pingback, createTask's callbackUrl), so that apps which only poll
	// gain pingbacks too. It must be an absolute http(s) URL served by this
	// Caddy. Default: none (submissions are unchanged).
	PingbackURL string `json:"pingback_url,omitempty"`

	// Largest submission body read to learn its parameters, in bytes.
	// A larger one is passed through untouched and not tracked.
	// Default: 8 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// Largest provider answer buffered to read the task id or the result
	// from, in bytes. A larger answer is streamed to the app unchanged,
	// untracked (no task recorded, no result stored), with a warn line, so
	// that a hostile or broken upstream cannot make Caddy hold it in
	// memory. Default: 1 MiB.
	MaxAnswer int64 `json:"max_answer,omitempty"`

	app      *App
	provider provider
	logger   *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (Tracker) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.pingback_track",
		New: func() caddy.Module { return new(Tracker) },
	}
}

// Provision sets defaults and finds the pingback app.
func (t *Tracker) Provision(ctx caddy.Context) error {
	t.logger = ctx.Logger()
	if t.MaxBody == 0 {
		t.MaxBody = DefaultTrackMaxBody
	}
	if t.MaxAnswer == 0 {
		t.MaxAnswer = DefaultMaxAnswer
	}
	var err error
	t.provider, t.app, err = provisionProvider(ctx, t.Provider)
	if err != nil {
		return err
	}
	t.app.noteTracker(t.Provider) // the provider's pingback handlers default to verify token
	if t.PingbackURL != "" {
		u, err := url.Parse(t.PingbackURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("pingback_url %q is not an absolute http(s) URL", t.PingbackURL)
		}
	}
	return nil
}

// Validate checks the configuration.
func (t *Tracker) Validate() error {
	if t.MaxBody <= 0 {
		return fmt.Errorf("max_body must be positive, got %d", t.MaxBody)
	}
	if t.MaxAnswer <= 0 {
		return fmt.Errorf("max_answer must be positive, got %d", t.MaxAnswer)
	}
	return nil
}

// ServeHTTP implements caddyhttp.MiddlewareHandler.
func (t *Tracker) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	next = t.upstreamGuard(next)
	switch path.Base(r.URL.Path) {
	case "in.php":
		return t.serveSubmit(w, r, next)
	case "res.php":
		return t.serveResult(w, r, next)
	case "createTask":
		if r.Method == http.MethodPost && t.provider.Has(protocol.JSON) {
			return t.serveCreateTask(w, r, next)
		}
	case "getTaskResult":
		if r.Method == http.MethodPost && t.provider.Has(protocol.JSON) {
			return t.serveGetTaskResult(w, r, next)
		}
	}
	return next.ServeHTTP(w, r)
}

// serveSubmit forwards an in.php submission and tracks the task it creates.
func (t *Tracker) serveSubmit(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	submitted := t.app.now().UTC() // when it entered pingback_track
	body, served, err := t.inspectBody(w, r, next, t.MaxBody, "submission too large to inspect; forwarded untracked")
	if served {
		return err
	}
	params := submitParams(r, body, t.MaxBody)
	pingback := params.Get("pingback")
	var token string
	body, pingback, token = t.tokenSubmission(r, body, pingback)
	setBody(r, body)

	return t.forwardSubmission(w, r, next, func(answer []byte) {
		if pingback == "" {
			return
		}
		if id, ok := protocol.ParseInAnswer(answer); ok && t.provider.ValidID(id) {
			ctx := context.WithoutCancel(r.Context())
			ts := trackSpec{provider: t.Provider, id: id, api: protocol.Legacy, method: params.Get("method"), pingbackURL: pingback, submittedAt: submitted, token: token, account: t.accountOf(params.Get("key"))}
			if _, _, err := t.app.trackTask(ctx, ts, false); err != nil {
				t.logger.Error("task NOT tracked: its result will not be polled if the pingback is lost",
					zap.String("provider", t.Provider), zap.String("id", id), zap.Error(err))
			}
		}
	})
}

// forwardSubmission forwards a submission (in.php, createTask) to the
// provider and, if the provider answers 200, calls track with the answer's
// body before the client has the answer. Until then the submission counts
// as in flight (submissionCounts), so that a pingback for the task it
// creates is not taken for an unknown task meanwhile.
func (t *Tracker) forwardSubmission(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, track func(answer []byte)) error {
	t.app.submissions.started(t.Provider)
	defer t.app.submissions.ended(t.Provider)
	rec, answer, err := t.bufferUpstream(w, r, next)
	if err != nil || rec == nil {
		return err
	}
	if rec.Status() == http.StatusOK {
		track(answer)
	}
	return rec.WriteResponse()
}

// serveResult answers res.php?action=get&id= from the store when it can.
func (t *Tracker) serveResult(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	body, served, err := t.inspectBody(w, r, next, 64<<10, "")
	if served {
		return err
	}
	params := submitParams(r, body, 64<<10)
	setBody(r, body)
	id := params.Get("id")
	if params.Get("action") != "get" || id == "" || params.Get("ids") != "" || !t.provider.ValidID(id) {
		return next.ServeHTTP(w, r)
	}
	asJSON := params.Get("json") == "1"
	key := store.Key{Provider: t.Provider, ID: t.provider.CanonicalID(id)}
	st := t.app.store(time.Second)
	// Answer locally only a trusted result (servedLocally), and only to
	// a caller that proves it owns the account: the key must be the
	// configured key of the task's account (mayAnswer). Task ids are
	// nearly sequential, so anything less would let anyone who reaches
	// this site read other accounts' results. For any other the provider
	// answers.
	if st != nil && t.app.providerConfig(t.Provider).hasKey(params.Get("key")) {
		if held, err := st.Get(r.Context(), key); err == nil && servedLocally(r.Context(), st, held) && t.mayAnswer(r.Context(), st, held, params.Get("key")) {
			body, ct := protocol.LocalResAnswer(held.Code, held.Answer, asJSON)
			return writeLocal(w, ct, body)
		}
	}
	return t.passSeenResult(w, r, next, st, key, protocol.SeenResAnswer)
}

// servedLocally reports whether a stored result may be answered by the
// local res.php / getTaskResult as the provider's answer: never a
// quarantined one, nor one whose payload was erased (keep_payload), nor
// one received before its task was submitted (a forgery for an id guessed
// ahead, stored under unknown_ids accept);
// one that completed its tracked task (Tracked), came from the provider
// itself (polled, or seen in its answer to the app) or has no task (an id
// submitted outside pingback_track, whose pingback the app was given as
// it is) is.
func servedLocally(ctx context.Context, st store.Store, rec *store.Record) bool {
	switch {
	case rec.State == store.StateQuarantined || rec.PayloadErased:
		return false
	case rec.Tracked || rec.Source == store.SourcePoll:
		return true
	}
	task, err := st.GetTask(ctx, rec.Key())
	if errors.Is(err, store.ErrNotFound) {
		return true
	}
	return err == nil && !rec.ReceivedAt.Before(task.SubmittedAt)
}

// passSeenResult passes a result request (res.php or getTaskResult) of the
// app through to the provider and, when the provider answers 200 with a
// result (seen reads it from the answer), stores it as delivered: the app
// has it. Stored once the app has it (a failed write stores nothing, so a
// later pingback or poll still delivers it).
func (t *Tracker) passSeenResult(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, st store.Store, key store.Key, seen func([]byte) (protocol.Answer, bool)) error {
	rec, answer, err := t.bufferUpstream(w, r, next)
	if err != nil || rec == nil {
		return err
	}
	ans, ok := seen(answer)
	if err := rec.WriteResponse(); err != nil {
		return err
	}
	if ok && rec.Status() == http.StatusOK && st != nil {
		t.storeSeenResult(st, key, ans)
	}
	return nil
}

// accountOf returns the account id of the key a submission carried ("" for
// none); the key itself is not kept.
func (t *Tracker) accountOf(key string) string {
	if key == "" {
		return ""
	}
	return accountID(t.Provider, key)
}

// mayAnswer reports whether held, a stored result that servedLocally
// trusts, may be answered locally to a result request carrying apiKey:
// apiKey must be the key of the account of the result's task
// (taskAccount); a result with no tracked task is answered only when the
// provider has a single configured key (with several, whose result it is
// is unknown: never one account's result to another). Without a
// configured key nothing is answered locally.
func (t *Tracker) mayAnswer(ctx context.Context, st store.Store, held *store.Record, apiKey string) bool {
	pc := t.app.providerConfig(t.Provider)
	if !pc.hasKey(apiKey) {
		return false
	}
	task, err := st.GetTask(ctx, held.Key())
	switch {
	case errors.Is(err, store.ErrNotFound):
		_, one := pc.onlyAccount()
		return one
	case err != nil:
		return false
	}
	acc, ok := pc.taskAccount(task.Account)
	return ok && hmac.Equal([]byte(acc.key), []byte(apiKey))
}

// storeSeenResult stores a result the app fetched itself, as delivered (the
// app has it): a later pingback or poll for it is then a duplicate.
func (t *Tracker) storeSeenResult(st store.Store, key store.Key, ans protocol.Answer) {
	a := t.app
	now := a.now().UTC()
	rec := &store.Record{
		Provider:   key.Provider,
		ID:         key.ID,
		Code:       ans.Code,
		Answer:     ans.Raw,
		Source:     store.SourcePoll,
		ReceivedAt: now,
		Delivery:   store.Delivery{State: store.StateDelivered, UpdatedAt: now},
		ExpiresAt:  now.Add(time.Duration(a.Retention)),
	}
	if task, err := st.GetTask(context.Background(), key); err == nil {
		if full, err := a.polledRecord(task, ans, now); err == nil {
			full.Delivery = store.Delivery{State: store.StateDelivered, UpdatedAt: now}
			rec = full
		}
	}
	res, err := st.Insert(context.Background(), rec)
	switch {
	case err != nil:
		t.logger.Error("storing a result seen in a passed-through answer failed", zap.String("key", key.String()), zap.Error(err))
	case res.Existing != nil && res.Existing.State == store.StateQuarantined:
		// The provider's own answer, which the app has: it replaces a
		// quarantined pingback (kept as other_code), delivered.
		if _, err := t.app.supersede(context.Background(), st, key, rec); err != nil && !errors.Is(err, store.ErrSkip) {
			t.logger.Error("storing a result seen in a passed-through answer over a quarantined one failed", zap.String("key", key.String()), zap.Error(err))
		}
	}
}

// inspectBody reads r's body for the track handler to inspect, at most
// limit bytes. When it cannot, it serves r itself and returns served=true
// with the error to return: a read error is a 400; a larger body is passed
// through to next untracked, with tooLarge logged as a warning unless it is
// empty.
func (t *Tracker) inspectBody(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, limit int64, tooLarge string) (body []byte, served bool, err error) {
	body, whole, err := readUpTo(r, limit)
	if err != nil {
		return nil, true, caddyhttp.Error(http.StatusBadRequest, err)
	}
	if !whole {
		if tooLarge != "" {
			t.logger.Warn(tooLarge, zap.Int64("max_body", limit))
		}
		return nil, true, next.ServeHTTP(w, r)
	}
	return body, false, nil
}

// readUpTo reads r's whole body if it is at most limit bytes. Otherwise it
// leaves r.Body able to replay what was read followed by the rest, and
// reports whole=false.
func readUpTo(r *http.Request, limit int64) (body []byte, whole bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true, nil
	}
	if r.ContentLength > limit {
		return nil, false, nil
	}
	body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, false, fmt.Errorf("reading request body: %w", err)
	}
	if int64(len(body)) > limit {
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), r.Body), r.Body}
		return nil, false, nil
	}
	return body, true, nil
}

// setBody makes body the request's body again.
func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	if body == nil {
		r.Body = http.NoBody
	}
	if r.Header.Get("Content-Length") != "" {
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
}

// submitParams returns the parameters of an in.php or res.php request:
// query fields, with form-body fields (urlencoded or multipart) winning,
// both read as the pingback handler reads them (parseFields). A body that
// parseFields refuses (a malformed multipart body, another Content-Type)
// gives just the query: the provider will judge it.
func submitParams(r *http.Request, body []byte, limit int64) url.Values {
	if fields, err := parseFields(r, body, limit); err == nil {
		return fields
	}
	return parseURLEncoded(r.URL.RawQuery)
}

// addPingback adds pingback=<u> to a submission that has none
// (protocol.AddPingback): to the request's query when it has no body, else
// to its body. It returns the new body.
func addPingback(r *http.Request, body []byte, u string) ([]byte, bool) {
	q, nb, ok := protocol.AddPingback(r.URL.RawQuery, r.Header.Get("Content-Type"), body, u)
	if !ok {
		return nil, false
	}
	if q != r.URL.RawQuery {
		r.URL.RawQuery = q
		r.RequestURI = r.URL.RequestURI()
	}
	return nb, true
}

// writeLocal writes a local answer: 200 with the body and its type.
func writeLocal(w http.ResponseWriter, contentType string, body []byte) error {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, err := w.Write(body)
	return err
}

// decodedBody returns a buffered response body, gunzipped (at most limit
// bytes) if the provider sent it compressed (for parsing only; the app gets
// the bytes as sent).
func decodedBody(h http.Header, b []byte, limit int64) []byte {
	if !strings.EqualFold(h.Get("Content-Encoding"), "gzip") {
		return b
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return b
	}
	out, err := io.ReadAll(io.LimitReader(zr, limit))
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
		return b
	}
	return out
}

// tokenSubmission adds a new pingback token to an in.php submission's
// pingback URL (the app's own, or pingback_url added where it has none):
// protocol.TokenPingback and protocol.AddToken, every other byte of the
// submission unchanged. It returns the new body, the pingback URL as the
// app will see it (without the token; "" for none) and the token, "" when
// none was added: a GET submission (the pingback in the query) whose
// pingback URL already has a query gets none, since 2captcha keeps only
// the first field of such a URL (docs/protocols.md, "Pingback tokens").
func (t *Tracker) tokenSubmission(r *http.Request, body []byte, pingback string) (newBody []byte, pingbackURL, token string) {
	tok := protocol.NewToken()
	if pingback != "" {
		q, nb, pb, ok := protocol.TokenPingback(r.URL.RawQuery, r.Header.Get("Content-Type"), body, tok)
		if !ok {
			return body, pingback, ""
		}
		if q != r.URL.RawQuery {
			r.URL.RawQuery = q
			r.RequestURI = r.URL.RequestURI()
		}
		return nb, pb, tok
	}
	if t.PingbackURL == "" {
		return body, "", ""
	}
	u, token := t.PingbackURL, ""
	if withToken, ok := protocol.AddToken(u, tok); ok && !(len(body) == 0 && strings.Contains(u, "?")) {
		u, token = withToken, tok
	}
	nb, ok := addPingback(r, body, u)
	if !ok {
		t.logger.Warn("could not add the pingback URL to this submission; forwarded unchanged")
		return body, "", ""
	}
	return nb, t.PingbackURL, token
}

// tokenCreateTask adds a new pingback token to a createTask request's
// callbackUrl (the app's own, or pingback_url added where it has none):
// protocol.TokenCallbackURL and protocol.AddCallbackURL. It returns the
// new body, the callback URL without the token ("" for none) and the
// token ("" when none was added).
func (t *Tracker) tokenCreateTask(body []byte, callback string) (newBody []byte, callbackURL, token string) {
	tok := protocol.NewToken()
	if callback != "" {
		nb, cb, ok := protocol.TokenCallbackURL(body, tok)
		if !ok {
			return body, callback, ""
		}
		return nb, cb, tok
	}
	if t.PingbackURL == "" {
		return body, "", ""
	}
	u, token := t.PingbackURL, ""
	if withToken, ok := protocol.AddToken(u, tok); ok {
		u, token = withToken, tok
	}
	nb, ok := protocol.AddCallbackURL(body, u)
	if !ok {
		t.logger.Warn("could not add callbackUrl to this createTask request; forwarded unchanged")
		return body, "", ""
	}
	return nb, t.PingbackURL, token
}

// trackSpec is a submitted task to track.
type trackSpec struct {
	provider string
	id       string
	api      protocol.API // protocol.Legacy or protocol.JSON
	method   string       // in.php's method or createTask's task type
	// pingbackURL is where polled results are delivered: the pingback (or
	// callbackUrl) the submission carried, or the one the plugin added.
	pingbackURL string
	submittedAt time.Time
	// token is the pingback token pingback_track added to the
	// submission's pingback URL (not part of pingbackURL), or "".
	token string
	// account is the account id of the API key the submission carried
	// (accountID), or "" if it carried none.
	account string
}

// trackTask durably records a submitted task as pending, so the poller can
// recover its result if the pingback never comes. The first poll is due
// `after` past submittedAt. It returns the stored task and whether it was
// new; a task already known is returned unchanged (and, for a submission
// seen by pingback_track, a reused id is logged at warn level). A pingback
// URL must be an absolute http(s) URL. With strict (the admin API), the
// provider must be pollable for the task's API family (an api_key
// configured) and the URL must be served by a pingback handler of this
// Caddy, else polled results could not be delivered.
func (a *App) trackTask(ctx context.Context, ts trackSpec, strict bool) (*store.Task, bool, error) {
	p, err := lookupProvider(ts.provider)
	if err != nil {
		return nil, false, inputError("%v", err)
	}
	if ts.api == "" {
		ts.api = protocol.Legacy
	}
	if !p.Has(ts.api) {
		return nil, false, inputError("provider %s has no %s API (it has: %v)", ts.provider, ts.api, p.APIs())
	}
	if !p.ValidID(ts.id) {
		return nil, false, inputError("malformed task id %q: want %s", ts.id, p.IDRule())
	}
	ts.id = p.CanonicalID(ts.id)
	u, err := url.Parse(ts.pingbackURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, false, inputError("pingback_url %q is not an absolute http(s) URL", ts.pingbackURL)
	}
	if strict {
		if err := a.pollable(ts.provider, ts.api); err != nil {
			return nil, false, inputError("%v", err)
		}
	}
	server, err := a.probePingbackURL(ctx, u, a.callbackMethodFor(ts.provider, ts.api))
	if err != nil {
		if strict {
			return nil, false, inputError("pingback_url refused: %v", err)
		}
		a.logger.Warn("tracking a task whose pingback URL this Caddy does not serve; polled results for it cannot be delivered",
			zap.String("provider", ts.provider), zap.String("id", ts.id), zap.Error(err))
	}
	st := a.store(time.Second)
	if st == nil {
		return nil, false, errStoreUnavailable
	}
	now := a.now().UTC()
	submittedAt := ts.submittedAt.UTC()
	api := string(ts.api)
	if ts.api == protocol.Legacy {
		api = "" // as stored before the JSON API existed
	}
	t := &store.Task{
		Provider:    ts.provider,
		ID:          ts.id,
		Method:      ts.method,
		API:         api,
		SubmittedAt: submittedAt,
		PingbackURL: ts.pingbackURL,
		Server:      server,
		State:       store.TaskPending,
		NextPollAt:  submittedAt.Add(a.pollAfter(ts.provider)),
		UpdatedAt:   now,
		ExpiresAt:   submittedAt.Add(max(time.Duration(a.Retention), time.Duration(a.Poll.GiveUp))),
		Token:       ts.token,
		Account:     ts.account,
	}
	existing, err := st.AddTask(ctx, t)
	if err != nil {
		return nil, false, fmt.Errorf("storing task: %w", err)
	}
	if existing != nil {
		if !strict {
			a.logger.Warn("submission answered with a task id the store already holds (a reused id): not tracked again",
				zap.String("provider", ts.provider), zap.String("id", ts.id),
				zap.Time("first_submitted_at", existing.SubmittedAt), zap.String("state", string(existing.State)))
		}
		return existing, false, nil
	}
	a.metrics.tasks.WithLabelValues(ts.provider, "tracked").Inc()
	if a.taskPollable(t) {
		a.countTracked(store.Account{Provider: t.Provider, ID: t.Account})
	} else {
		a.noteUnpollable(t)
	}
	// A pingback that came while the submission was in flight was held
	// in quarantine as an unknown id: check it now.
	a.recheckHeld(ctx, st, t)
	return t, true, nil
}

// inputError is a trackTask error caused by the caller's input (the admin
// API answers it with 400).
func inputError(format string, args ...any) error {
	return &badRequest{status: 400, reason: fmt.Sprintf(format, args...)}
}

// noteTracker records that the config has a pingback_track for provider.
func (a *App) noteTracker(provider string) {
	a.trackersMu.Lock()
	defer a.trackersMu.Unlock()
	if a.trackers == nil {
		a.trackers = map[string]bool{}
	}
	a.trackers[provider] = true
}

// hasTracker reports whether the config has a pingback_track for provider.
func (a *App) hasTracker(provider string) bool {
	a.trackersMu.Lock()
	defer a.trackersMu.Unlock()
	return a.trackers[provider]
}

// submissionCounts counts, per provider, the submissions pingback_track
// has passed to the provider whose task is not yet committed, for one
// store location in this process: a pingback for an unknown id meanwhile
// may be theirs, so it is held (quarantined and re-checked when the task
// commits) rather than rejected. It is pooled (submissionPool) from
// Provision to Cleanup, so a submission of an old config still counts for
// the new one during a reload, and one made while Start opens the store
// counts too. A nil *submissionCounts counts nothing.
type submissionCounts struct {
	mu sync.Mutex
	n  map[string]int
}

// submissionPool holds one *submissionCounts per store location.
var submissionPool = caddy.NewUsagePool()

// Destruct implements caddy.Destructor: nothing to release.
func (*submissionCounts) Destruct() error { return nil }

// provisionSubmissions takes a reference to the submission counts of a's
// store location (Cleanup releases it).
func (a *App) provisionSubmissions() error {
	v, _, err := submissionPool.LoadOrNew(a.dir, func() (caddy.Destructor, error) {
		return &submissionCounts{n: map[string]int{}}, nil
	})
	if err != nil {
		return err
	}
	a.submissions, a.countsHeld = v.(*submissionCounts), true
	return nil
}

func (c *submissionCounts) started(provider string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[provider]++
}

func (c *submissionCounts) ended(provider string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[provider]--
}

func (c *submissionCounts) inFlight(provider string) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[provider] > 0
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Tracker)(nil)
	_ caddy.Validator             = (*Tracker)(nil)
	_ caddyhttp.MiddlewareHandler = (*Tracker)(nil)
)
