package pingback

import (
	"context"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
)

// The forwards of a config are cut cutAfter after the config begins to
// stop. That moment is the core's "stopping" event (emitted before any app
// is stopped, so also before the http app waits for its requests when Caddy
// exits) or, failing that, this app's Stop, whichever comes first. The
// event is marked experimental in Caddy; Stop alone still bounds a reload.

// watchStopping subscribes the app to its config's "stopping" event, if
// the config has an events app (the http app loads one).
func (a *App) watchStopping(ctx caddy.Context) {
	v, err := ctx.App("events")
	if err != nil {
		return
	}
	if ev, ok := v.(*caddyevents.App); ok {
		_ = ev.On("stopping", stoppingHandler{a})
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
