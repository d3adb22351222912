package pingback

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"
)

// The forwards of a config are cut cutAfter after the config begins to
// stop. That moment is the core's "stopping" event (emitted before any app
// is stopped, so also before the http app waits for its requests when Caddy
// exits) or this app's Stop, whichever comes first. The event is marked
// experimental in Caddy; should it go away, a reload is still bounded
// (the http app does not wait for requests then) but an exit whose http
// app stops first waits for its forwards up to forward_timeout.

// watchStopping subscribes the app to its config's "stopping" event
// (loading the config's events app, as the http app does anyway).
func (a *App) watchStopping(ctx caddy.Context) {
	v, err := ctx.App("events")
	if err != nil {
		a.logger.Warn("no events app: forwards are cut only from this app's Stop", zap.Error(err))
		return
	}
	ev, ok := v.(*caddyevents.App)
	if !ok {
		return
	}
	if err := ev.On("stopping", stoppingHandler{a}); err != nil {
		a.logger.Warn("cannot watch the stopping event: forwards are cut only from this app's Stop", zap.Error(err))
	}
}

// beginCut starts the countdown to cutting this config's forwards; later
// calls do nothing.
func (a *App) beginCut() {
	a.cutOnce.Do(func() { time.AfterFunc(cutAfter, a.cutCancel) })
}

// stoppingHandler receives the "stopping" event.
type stoppingHandler struct{ a *App }

// Handle implements caddyevents.Handler.
func (h stoppingHandler) Handle(context.Context, caddy.Event) error {
	h.a.beginCut()
	return nil
}

// Interface guards
var _ caddyevents.Handler = stoppingHandler{}
