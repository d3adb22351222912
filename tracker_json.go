package pingback

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// maxResultRequest bounds the getTaskResult (and res.php) request bodies
// the track handler reads; larger ones pass through.
const maxResultRequest = 64 << 10

// serveCreateTask forwards a createTask request, adding callbackUrl when
// PingbackURL is set and the request carries none, and tracks the task its
// answer names. A synchronous answer (status "ready", CapSolver) is stored
// at once: delivered to the callback URL like a polled result when one is
// known, else stored as delivered (the app has it in the answer).
func (t *Tracker) serveCreateTask(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	submitted := t.app.now().UTC() // when it entered pingback_track
	body, served, err := t.inspectBody(w, r, next, t.MaxBody, "createTask request too large to inspect; forwarded untracked")
	if served {
		return err
	}
	ct, ok := protocol.ParseCreateTask(body)
	if !ok {
		setBody(r, body)
		return next.ServeHTTP(w, r) // not JSON: the provider will judge it
	}
	var callback, token string
	body, callback, token = t.tokenCreateTask(body, ct.CallbackURL)
	setBody(r, body)

	return t.forwardSubmission(w, r, next, func(answer []byte) {
		id, sync, ok := protocol.ParseCreateTaskAnswer(answer)
		if ok && t.provider.ValidID(id) {
			t.trackCreated(r.Context(), id, ct.TaskType, callback, token, t.accountOf(ct.ClientKey), submitted, sync)
		}
	})
}

// trackCreated records a task created through createTask, and stores a
// synchronous result.
func (t *Tracker) trackCreated(rctx context.Context, id, taskType, callback, token, account string, submitted time.Time, sync *protocol.Answer) {
	ctx := context.WithoutCancel(rctx)
	id = t.provider.CanonicalID(id)
	var task *store.Task
	if callback != "" {
		ts := trackSpec{provider: t.Provider, id: id, api: protocol.JSON, method: taskType, pingbackURL: callback, submittedAt: submitted, token: token, account: account}
		var err error
		if task, _, err = t.app.trackTask(ctx, ts, false); err != nil {
			t.logger.Error("task NOT tracked: its result will not be polled if the callback is lost",
				zap.String("provider", t.Provider), zap.String("id", id), zap.Error(err))
		}
	}
	if sync == nil {
		return
	}
	st := t.app.store(time.Second)
	if st == nil {
		t.logger.Error("synchronous result NOT stored: store not open", zap.String("provider", t.Provider), zap.String("id", id))
		return
	}
	if task != nil && task.State == store.TaskPending {
		t.app.deliverPolled(task, *sync)
		return
	}
	t.storeSeenResult(st, store.Key{Provider: t.Provider, ID: id}, *sync)
}

// serveGetTaskResult answers getTaskResult locally for a result the plugin
// holds in getTaskResult's shape, asked with the clientKey of the task's
// account (mayAnswer);
// anything else passes through, and a result seen in the provider's answer
// is stored as delivered (the app has it). For providers that limit result
// calls per task (CapMonster), the app's passed-through calls are counted
// on the task.
func (t *Tracker) serveGetTaskResult(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	body, served, err := t.inspectBody(w, r, next, maxResultRequest, "")
	if served {
		return err
	}
	setBody(r, body)
	clientKey, id, ok := protocol.ParseGetTaskResultRequest(body)
	if !ok || !t.provider.ValidID(id) {
		return next.ServeHTTP(w, r)
	}
	key := store.Key{Provider: t.Provider, ID: t.provider.CanonicalID(id)}
	st := t.app.store(time.Second)
	if st != nil && t.app.providerConfig(t.Provider).hasKey(clientKey) {
		// Only a trusted result is answered locally (servedLocally), to
		// the key of its task's account (mayAnswer).
		if held, err := st.Get(r.Context(), key); err == nil && servedLocally(r.Context(), st, held) && t.mayAnswer(r.Context(), st, held, clientKey) {
			if answer, ok := protocol.LocalTaskResult(held.Answer); ok {
				return writeLocal(w, "application/json", answer)
			}
		}
	}
	if st != nil && t.provider.MaxResultCalls > 0 {
		t.countAppPoll(st, key)
	}
	return t.passSeenResult(w, r, next, st, key, protocol.SeenTaskResult)
}

// countAppPoll counts one of the app's own getTaskResult calls on a
// tracked pending task.
func (t *Tracker) countAppPoll(st store.Store, key store.Key) {
	now := t.app.now().UTC()
	_, err := st.UpdateTask(context.Background(), key, func(task *store.Task) error {
		if task.State != store.TaskPending {
			return store.ErrSkip
		}
		task.AppPolls++
		task.AppPolledAt = now
		return nil
	})
	if err != nil && !errors.Is(err, store.ErrSkip) && !errors.Is(err, store.ErrNotFound) {
		t.logger.Warn("counting the app's getTaskResult call failed", zap.String("key", key.String()), zap.Error(err))
	}
}
