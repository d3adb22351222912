package pingback

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// deliverPolled stores a polled result like a pingback (durable, deduplicated:
// if the pingback was stored first this is a duplicate and stops here),
// queued for its first forward, and wakes the replay loop, which delivers it
// to the task's pingback URL in-process, in the provider's pingback format,
// with X-Pingback-Source: poll, as soon as a forward slot is free.
func (a *App) deliverPolled(t *store.Task, ans protocol.Answer) {
	now := a.now().UTC()
	rec, err := a.polledRecord(t, ans, now)
	if err != nil {
		a.logger.Error("cannot deliver polled result", zap.String("key", t.Key().String()), zap.Error(err))
		a.expireTask(t, err.Error())
		return
	}
	// Not loopCtx: a result fetched while the config stops is stored all
	// the same (else it would cost another request to the provider).
	res, err := a.handle.store.Insert(context.Background(), rec)
	switch {
	case err != nil:
		// The task stays pending: polled again next interval.
		a.logger.Error("storing polled result failed; will poll again", zap.String("key", t.Key().String()), zap.Error(err))
		return
	case res.Existing != nil:
		a.polledExisting(t, ans, res.Existing, rec)
		return
	}
	a.metrics.callbacks.WithLabelValues(t.Provider, "poll_stored").Inc()
	a.metrics.tasks.WithLabelValues(t.Provider, "recovered").Inc()
	a.logger.Info("result recovered by polling", zap.String("key", t.Key().String()))
	a.handle.wake()
}

// polledRecord builds the record of a polled result: the request is the
// pingback the provider would have sent to the task's pingback URL, in the
// provider's callback format:
//   - an in.php task: GET with id and code appended to the URL's own query,
//     kept exactly as given (callback_method get), or POST form id=&code=
//     (callback_method post); extra members of a res.php JSON answer
//     (Turnstile's useragent) follow as fields of the same names;
//   - a createTask task: POST application/json, the getTaskResult answer
//     with taskId (callback_format json), or POST form id and code, the
//     solution's token (callback_format form).
//
// The record keeps code and the provider's whole answer.
func (a *App) polledRecord(t *store.Task, ans protocol.Answer, now time.Time) (*store.Record, error) {
	u, err := url.Parse(t.PingbackURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("task pingback URL %q is not an absolute URL", t.PingbackURL)
	}
	srv := t.Server
	if srv == "" { // tracked before tasks named their server
		if srv, err = a.serverForURL(context.Background(), u, a.callbackMethodFor(t.Provider, protocol.API(t.API))); err != nil {
			return nil, err
		}
	}
	pc := a.providerConfig(t.Provider)
	prov, _ := lookupProvider(t.Provider)
	req := store.Request{
		Method:     http.MethodPost,
		Host:       u.Host,
		Proto:      "HTTP/1.1",
		RemoteAddr: "127.0.0.1:0",
		LocalAddr:  ":" + strconv.FormatUint(uint64(urlPort(u)), 10),
		TLS:        u.Scheme == "https",
		Header:     http.Header{"User-Agent": {"caddy-pingback poller"}},
	}
	uri := u.EscapedPath()
	if uri == "" {
		uri = "/"
	}
	req.URI = uri
	if u.RawQuery != "" {
		req.URI += "?" + u.RawQuery
	}
	switch {
	case t.API == string(protocol.JSON) && pc.format == protocol.JSONPOST:
		req.Body = prov.JSONCallbackBody(t.ID, ans.Raw)
		if req.Body == nil {
			return nil, fmt.Errorf("the provider's answer for task %s is not a JSON object", t.ID)
		}
		req.Header.Set("Content-Type", "application/json")
	case t.API == string(protocol.JSON):
		code := ans.Code
		if ans.Kind == protocol.Result {
			code = protocol.FormCode(protocol.Solution(ans.Raw))
		}
		req.Body = protocol.LegacyCallbackForm(t.ID, code, nil)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	case pc.method == http.MethodGet:
		req.Method = http.MethodGet
		req.URI = uri + "?" + protocol.LegacyCallbackQuery(u.RawQuery, t.ID, ans.Code, protocol.ExtraFields(ans.Raw))
	default:
		req.Body = protocol.LegacyCallbackForm(t.ID, ans.Code, protocol.ExtraFields(ans.Raw))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	return &store.Record{
		Provider:   t.Provider,
		ID:         t.ID,
		Code:       ans.Code,
		Answer:     ans.Raw,
		Source:     store.SourcePoll,
		ReceivedAt: now,
		Server:     srv,
		Request:    req,
		Delivery:   store.Delivery{State: store.StateQueued, DueAt: now, UpdatedAt: now},
		ExpiresAt:  now.Add(time.Duration(a.Retention)),
		// Read from the provider's result API: the provider's own answer.
		Verified: VerifyResPHP,
		Tracked:  true,
	}, nil
}

// callbackMethodFor is the HTTP method polled results of a task of the
// provider and API family are delivered with (for the pingback URL probe).
func (a *App) callbackMethodFor(provider string, api protocol.API) string {
	if api == protocol.JSON {
		return http.MethodPost
	}
	return a.providerConfig(provider).method
}

// polledExisting settles a polled result whose key already holds a
// record. The polled answer is the provider's own: a quarantined record
// is superseded by it (delivered, the quarantined code kept as
// other_code); a record with another code is corrected (delivered again
// as a correction if the app had the wrong one); either way the task is
// done, since the result is now known. The same code is a duplicate.
func (a *App) polledExisting(t *store.Task, ans protocol.Answer, existing, rec *store.Record) {
	st := a.handle.store
	ctx := context.Background()
	switch {
	case existing.State == store.StateQuarantined:
		if _, err := a.supersede(ctx, st, t.Key(), rec); err != nil {
			if !errors.Is(err, store.ErrSkip) {
				a.logger.Error("storing polled result over a quarantined one failed; will poll again", zap.String("key", t.Key().String()), zap.Error(err))
			}
			return
		}
		a.metrics.callbacks.WithLabelValues(t.Provider, "poll_stored").Inc()
		a.logger.Info("result recovered by polling; a quarantined pingback of it is kept as other_code", zap.String("key", t.Key().String()))
		a.handle.wake()
		return
	case !sameResult(existing.Code, ans):
		a.correct(ctx, st, t, ans, true, a.logger)
	default:
		a.metrics.callbacks.WithLabelValues(t.Provider, "poll_duplicate").Inc()
	}
	a.finishTask(t, existing.ReceivedAt)
}

// finishTask marks a pending task done: its result is known.
func (a *App) finishTask(t *store.Task, resultAt time.Time) {
	now := a.now().UTC()
	_, err := a.handle.store.UpdateTask(context.Background(), t.Key(), func(t *store.Task) error {
		if t.State != store.TaskPending {
			return store.ErrSkip
		}
		t.State, t.NextPollAt, t.UpdatedAt, t.ResultAt = store.TaskDone, time.Time{}, now, resultAt
		return nil
	})
	if err != nil && !errors.Is(err, store.ErrSkip) {
		a.logger.Warn("marking a task done failed; it is polled again", zap.String("key", t.Key().String()), zap.Error(err))
	}
}
