package pingback

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/notify"
)

// NotifyConfig configures the notifications of the plugin's events: the
// route-failing threshold, and optionally a URL that receives them as
// signed JSON POSTs (for users with no other alerting).
type NotifyConfig struct {
	// URL receives the events as POSTs of a JSON array of messages
	// (http or https). Empty: nothing is POSTed; the events still go to
	// Caddy's events app.
	URL string `json:"url,omitempty"`
	// Secret keys the X-Pingback-Signature header of each POST
	// ("sha256=" and the hex HMAC-SHA256 of the raw body). Required with
	// URL; placeholders such as {env.PINGBACK_NOTIFY_SECRET} are resolved
	// when the app starts (an empty result is an error).
	Secret string `json:"secret,omitempty"`
	// Interval: at most one message per event name and provider per
	// interval, with the count of what it stands for; also the most often
	// pingback_results_quarantined is emitted per provider. Default: 5m.
	Interval caddy.Duration `json:"interval,omitempty"`
	// FailingAfter is how long a route's forwards must fail, without a
	// success between, before pingback_route_failing is emitted.
	// Default: 10m.
	FailingAfter caddy.Duration `json:"failing_after,omitempty"`
}

// notifyConfig returns a.Notify, made if unset (the Caddyfile parser).
func (a *App) notifyConfig() *NotifyConfig {
	if a.Notify == nil {
		a.Notify = new(NotifyConfig)
	}
	return a.Notify
}

// notifyInterval is notify's interval, or its default.
func (a *App) notifyInterval() time.Duration {
	if a.Notify != nil && a.Notify.Interval > 0 {
		return time.Duration(a.Notify.Interval)
	}
	return notify.DefaultInterval
}

// failingAfter is notify's failing_after, or its default.
func (a *App) failingAfter() time.Duration {
	if a.Notify != nil && a.Notify.FailingAfter > 0 {
		return time.Duration(a.Notify.FailingAfter)
	}
	return DefaultFailingAfter
}

// validateNotify checks notify: a URL with a scheme and host, a secret
// with it, and no negative duration.
func (a *App) validateNotify() error {
	n := a.Notify
	if n == nil {
		return nil
	}
	switch {
	case n.Interval < 0:
		return fmt.Errorf("notify interval must be positive, got %s", time.Duration(n.Interval))
	case n.FailingAfter < 0:
		return fmt.Errorf("failing_after must be positive, got %s", time.Duration(n.FailingAfter))
	case n.URL == "" && n.Secret != "":
		return errors.New("notify secret is set without a url")
	case n.URL == "":
		return nil
	case n.Secret == "":
		return errors.New("notify needs a secret to sign its messages with (secret {env.PINGBACK_NOTIFY_SECRET}, say)")
	}
	u, err := url.Parse(n.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("notify url must be an http or https URL, got %q", n.URL)
	}
	return nil
}

// newNotifier returns the app's notifier, nil without notify's url; the
// secret's placeholders are resolved now.
func (a *App) newNotifier() (*notify.Notifier, error) {
	n := a.Notify
	if n == nil || n.URL == "" {
		return nil, nil
	}
	secret := strings.TrimSpace(caddy.NewReplacer().ReplaceAll(n.Secret, ""))
	if secret == "" {
		return nil, errors.New("notify secret is empty once its placeholders are resolved (is the environment variable set?)")
	}
	return notify.New(notify.Config{
		URL: n.URL, Secret: secret, Interval: a.notifyInterval(), Logger: a.logger.Named("notify"),
	}), nil
}
