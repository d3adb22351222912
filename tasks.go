package pingback

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

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
	a.countTracked(ts.provider, a.handle.provider(ts.provider))
	a.metrics.tasks.WithLabelValues(ts.provider, "tracked").Inc()
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
