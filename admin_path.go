package pingback

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// pathSegments splits the admin request's path after prefix into its
// segments, on the escaped path (url.URL.EscapedPath), and unescapes each
// one: "%2F" inside a segment is part of it, not a separator, so
// /pingback/records/2captcha/a%2Fb names the id "a/b". A segment that does
// not unescape is returned as it is (no stored key has it).
func pathSegments(r *http.Request, prefix string) []string {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	if !ok {
		return nil
	}
	parts := strings.Split(rest, "/")
	for i, p := range parts {
		if u, err := url.PathUnescape(p); err == nil {
			parts[i] = u
		}
	}
	return parts
}

// checkSubmittedAt refuses a registered task's submitted_at outside
// [now - giveUp, now]: a task submitted later than now does not exist yet,
// and one submitted before its give_up would be expired at once (and a
// time near year 1 or 1970 would make the store's expiry wrap).
func checkSubmittedAt(submitted, now time.Time, giveUp time.Duration) error {
	switch {
	case submitted.After(now):
		return fmt.Errorf("submitted_at %s is in the future (now %s)", submitted.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	case submitted.Before(now.Add(-giveUp)):
		return fmt.Errorf("submitted_at %s is older than give_up (%s): the task would be expired at once", submitted.UTC().Format(time.RFC3339), giveUp)
	}
	return nil
}

// giveUpFor is the provider's give_up (the global one for an unknown
// provider, which trackTask then refuses).
func (a *App) giveUpFor(provider string) time.Duration {
	if _, err := lookupProvider(provider); err != nil {
		return time.Duration(a.Poll.GiveUp)
	}
	return a.providerConfig(provider).giveUp
}
