package pingback

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// trackTask durably records a submitted task as pending, so the poller can
// recover its result if the pingback never comes. The first poll is due
// `after` past submittedAt. It returns the stored task and whether it was
// new; a task already known is returned unchanged. A pingback URL must be an
// absolute http(s) URL; with strict, it must also be served by a server of
// this Caddy (else polled results could not be delivered).
func (a *App) trackTask(ctx context.Context, provider, id, method, pingbackURL string, submittedAt time.Time, strict bool) (*store.Task, bool, error) {
	p, err := lookupProvider(provider)
	if err != nil {
		return nil, false, inputError("%v", err)
	}
	if !p.validID(id) {
		return nil, false, inputError("malformed task id %q: want %s", id, p.idRule)
	}
	u, err := url.Parse(pingbackURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, false, inputError("pingback_url %q is not an absolute http(s) URL", pingbackURL)
	}
	server, err := a.probePingbackURL(ctx, u, a.providerConfig(provider).method)
	if err != nil {
		if strict {
			return nil, false, inputError("pingback_url refused: %v", err)
		}
		a.logger.Warn("tracking a task whose pingback URL this Caddy does not serve; polled results for it cannot be delivered",
			zap.String("provider", provider), zap.String("id", id), zap.Error(err))
	}
	st := a.store(time.Second)
	if st == nil {
		return nil, false, errStoreUnavailable
	}
	now := a.now().UTC()
	submittedAt = submittedAt.UTC()
	t := &store.Task{
		Provider:    provider,
		ID:          id,
		Method:      method,
		SubmittedAt: submittedAt,
		PingbackURL: pingbackURL,
		Server:      server,
		State:       store.TaskPending,
		NextPollAt:  submittedAt.Add(a.pollAfter(provider)),
		UpdatedAt:   now,
		ExpiresAt:   submittedAt.Add(max(time.Duration(a.Retention), time.Duration(a.Poll.GiveUp))),
	}
	existing, err := st.AddTask(ctx, t)
	if err != nil {
		return nil, false, fmt.Errorf("storing task: %w", err)
	}
	if existing != nil {
		return existing, false, nil
	}
	a.countTracked(provider, a.handle.provider(provider))
	a.metrics.tasks.WithLabelValues(provider, "tracked").Inc()
	return t, true, nil
}

// inputError is a trackTask error caused by the caller's input (the admin
// API answers it with 400).
func inputError(format string, args ...any) error {
	return &badRequest{status: 400, reason: fmt.Sprintf(format, args...)}
}
