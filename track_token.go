package pingback

import (
	"net/http"
	"strings"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

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
