package pingback

import (
	"cmp"
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// Headers the app receives with every delivery of a result (live,
// polled or replayed). Any X-Pingback-* header the request came with is
// removed first: only the plugin says what they say.
const (
	// HeaderIdempotencyKey is "<provider>:<task id>", the same for every
	// delivery of one result.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderSource is "callback" for a live pingback, "poll" for the first
	// delivery of a result the poller fetched, "replay" for every
	// redelivery (retries, recovery after a crash or reload, by hand).
	HeaderSource = "X-Pingback-Source"
	// HeaderAttempt is the forward's 1-based attempt number.
	HeaderAttempt = "X-Pingback-Attempt"
	// HeaderVerified says how the result was verified: token, res_php
	// or none.
	HeaderVerified = "X-Pingback-Verified"
	// HeaderTracked is true when the result's task was submitted through
	// pingback_track (or registered by the admin API), else false.
	HeaderTracked = "X-Pingback-Tracked"
)

// StoredHeaders are the request headers the pingback handler keeps with a
// stored result, the ones a replay needs to reach the app as the provider's
// request did: how the body is encoded and who sent it. Every other header
// (Authorization, Cookie, X-Api-Key, whatever a proxy in front added) is
// forwarded on the live delivery only and never written to the store; the
// handler's keep_headers adds names to this list.
var StoredHeaders = []string{
	"Accept",
	"Accept-Encoding",
	"Content-Encoding",
	"Content-Length",
	"Content-Type",
	"Forwarded",
	"User-Agent",
	"X-Forwarded-For",
	"X-Forwarded-Host",
	"X-Forwarded-Proto",
	"X-Real-Ip",
}

// storedHeader returns the headers of h kept in the store: StoredHeaders
// and keep (canonical names), values copied. nil when none is present.
func storedHeader(h http.Header, keep []string) http.Header {
	var out http.Header
	add := func(name string) {
		if v, ok := h[name]; ok {
			if out == nil {
				out = make(http.Header, len(StoredHeaders))
			}
			out[name] = append([]string(nil), v...)
		}
	}
	for _, name := range StoredHeaders {
		add(name)
	}
	for _, name := range keep {
		add(name)
	}
	return out
}

// canonicalHeaderNames checks keep_headers' names (RFC 9110 tokens) and
// returns them in canonical form.
func canonicalHeaderNames(names []string) ([]string, error) {
	out := make([]string, 0, len(names))
	for _, n := range names {
		if n == "" || strings.IndexFunc(n, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
			return nil, fmt.Errorf("keep_headers: %q is not a header name", n)
		}
		out = append(out, textproto.CanonicalMIMEHeaderKey(n))
	}
	return out, nil
}

// isTokenChar reports whether r may appear in a header name (RFC 9110
// section 5.6.2, tchar).
func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}

// redactedValue replaces a credential header's values in admin answers.
const redactedValue = "[redacted]"

// credentialHeaders are header names (lower case) whose values are
// credentials wherever they appear.
var credentialHeaders = map[string]bool{
	"authorization":        true,
	"proxy-authorization":  true,
	"cookie":               true,
	"set-cookie":           true,
	"x-api-key":            true,
	"api-key":              true,
	"x-auth-token":         true,
	"x-access-token":       true,
	"x-csrf-token":         true,
	"x-xsrf-token":         true,
	"x-amz-security-token": true,
}

// credentialWords mark a header name as a credential's when they appear
// in it: X-Client-Secret, X-Session-Id, X-Hub-Signature, My-Apikey...
var credentialWords = []string{"auth", "token", "secret", "passw", "apikey", "api-key", "api_key", "session", "credential", "signature", "cookie"}

// isCredentialHeader reports whether the values of the header name are
// secrets that an admin answer must not show.
func isCredentialHeader(name string) bool {
	n := strings.ToLower(name)
	if credentialHeaders[n] {
		return true
	}
	for _, w := range credentialWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// redactHeader returns h with the values of credential headers replaced
// by redactedValue (a copy when it changes anything; h itself otherwise).
func redactHeader(h http.Header) http.Header {
	var out http.Header
	for name, vs := range h {
		if !isCredentialHeader(name) {
			continue
		}
		if out == nil {
			out = h.Clone()
		}
		red := make([]string, len(vs))
		for i := range red {
			red[i] = redactedValue
		}
		out[name] = red
	}
	if out == nil {
		return h
	}
	return out
}

// publicRecord is rec as an admin answer shows it: credential headers
// redacted, and the pingback token's value in the request URI
// (pingback_token=[redacted]); a shallow copy when it changes anything.
func publicRecord(rec *store.Record) *store.Record {
	if rec == nil {
		return nil
	}
	uri := protocol.RedactTokenURI(rec.Request.URI, redactedValue)
	if len(rec.Request.Header) == 0 && uri == rec.Request.URI {
		return rec
	}
	cp := *rec
	cp.Request.Header = redactHeader(rec.Request.Header)
	cp.Request.URI = uri
	return &cp
}

// publicTask is t as an admin answer shows it: without its pingback token
// (a copy when it has one), which would let whoever reads the answer
// forge the task's pingback.
func publicTask(t *store.Task) *store.Task {
	if t == nil || t.Token == "" {
		return t
	}
	cp := *t
	cp.Token = ""
	return &cp
}

// setDeliveryHeaders sets the headers the app sees on every delivery,
// after removing every X-Pingback-* header the request came with (only
// the plugin says what they say). A correction's idempotency key is
// "<provider>:<id>:correction".
func setDeliveryHeaders(h http.Header, rec *store.Record, source store.Source, attempt int) {
	for name := range h {
		if strings.HasPrefix(http.CanonicalHeaderKey(name), "X-Pingback-") {
			delete(h, name)
		}
	}
	key := rec.Key().String()
	if rec.Correction {
		key += ":correction"
	}
	h.Set(HeaderIdempotencyKey, key)
	h.Set(HeaderSource, string(source))
	h.Set(HeaderAttempt, strconv.Itoa(attempt))
	h.Set(HeaderVerified, cmp.Or(rec.Verified, VerifyNone))
	h.Set(HeaderTracked, strconv.FormatBool(rec.Tracked))
	setAgeHeaders(h, rec) // the result's age (max_age)
}

// stripToken removes the pingback token from the request's query, so the
// app sees exactly the URL it gave.
func stripToken(r *http.Request) {
	if !strings.Contains(r.URL.RawQuery, protocol.TokenParam) {
		return
	}
	r.URL.RawQuery = protocol.StripToken(r.URL.RawQuery)
	r.RequestURI = protocol.StripTokenURI(r.RequestURI)
}
