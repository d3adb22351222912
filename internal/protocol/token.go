package protocol

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"mime"
	"net/url"
	"strings"
)

// Pingback tokens. Providers do not sign pingbacks, and task ids are
// nearly sequential, so the plugin adds a per-task random token to each
// pingback URL it sees in a submission, as one more query parameter, and
// trusts a pingback only if it carries its task's token.
//
// Why a query parameter is safe for every provider (docs/protocols.md,
// "Pingback tokens", gives the sources):
//   - 2captcha and rucaptcha take any URL on the registered domain or IP,
//     query included, and keep it when they call it ("id" and "code" go in
//     the POST body); only a GET submission loses the fields after the
//     first one of a pingback URL with several, so a GET submission whose
//     pingback URL already has a query gets no token.
//   - CaptchaAI appends "id" and "code" to the URL's own query (its blog):
//     the token stays, as the first field.
//   - The createTask APIs take callbackUrl as a JSON string; nothing in
//     their documentation limits its query.
//
// The value is 32 lower-case hex digits (128 random bits): unreserved
// characters, the same escaped or not, so no provider's re-encoding of the
// URL can change it; the name does not clash with the fields providers
// add (id, code, taskId).

// TokenParam is the query parameter that carries a pingback token.
const TokenParam = "pingback_token"

// tokenLen is the length of a token: 16 random bytes in hex.
const tokenLen = 32

// NewToken returns a new random pingback token.
func NewToken() string {
	var b [tokenLen / 2]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// ValidToken reports whether s has the form of a token.
func ValidToken(s string) bool {
	if len(s) != tokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// tokenSuffix is what AddToken appends to a URL: "?pingback_token=<t>",
// or with '&' when the URL already has a query (nothing after an empty
// query or a trailing '&').
func tokenSuffix(u, token string) string {
	_, q, hasQuery := strings.Cut(u, "?")
	switch {
	case !hasQuery:
		return "?" + TokenParam + "=" + token
	case q == "" || strings.HasSuffix(q, "&"):
		return TokenParam + "=" + token
	}
	return "&" + TokenParam + "=" + token
}

// AddToken returns u with the token added as the last field of its query.
// ok is false for a URL with a fragment (the query would end before it)
// or one that already carries a token.
func AddToken(u, token string) (string, bool) {
	if strings.Contains(u, "#") {
		return "", false
	}
	if i := strings.IndexByte(u, '?'); i >= 0 {
		if _, n := QueryToken(u[i+1:]); n > 0 {
			return "", false
		}
	}
	return u + tokenSuffix(u, token), true
}

// QueryToken finds the token in a raw query, split on '&' as
// parseURLEncoded splits it: the raw value of the first pingback_token
// field and how many such fields there are. The value is not unescaped:
// a real token needs no escaping, so an escaped one never matches.
func QueryToken(rawQuery string) (token string, n int) {
	for field := range strings.SplitSeq(rawQuery, "&") {
		name, value, _ := strings.Cut(field, "=")
		if name == TokenParam {
			if n == 0 {
				token = value
			}
			n++
		}
	}
	return token, n
}

// StripToken returns rawQuery without its pingback_token fields, every
// other byte as it was (a query that held only the token becomes "").
func StripToken(rawQuery string) string {
	if !strings.Contains(rawQuery, TokenParam) {
		return rawQuery
	}
	fields := strings.Split(rawQuery, "&")
	kept := fields[:0]
	for _, f := range fields {
		if name, _, _ := strings.Cut(f, "="); name != TokenParam {
			kept = append(kept, f)
		}
	}
	return strings.Join(kept, "&")
}

// StripTokenURI returns a request URI (path, then '?' and the query) with
// the token taken out of its query; a '?' left with nothing after it goes
// too, so the app sees exactly the URL it gave.
func StripTokenURI(uri string) string {
	path, q, ok := strings.Cut(uri, "?")
	if !ok {
		return uri
	}
	q = StripToken(q)
	if q == "" {
		return path
	}
	return path + "?" + q
}

// RedactTokenURI returns a request URI with the value of each
// pingback_token field of its query replaced by placeholder, every other
// byte as it was: what an admin answer shows of a stored request.
func RedactTokenURI(uri, placeholder string) string {
	path, q, ok := strings.Cut(uri, "?")
	if !ok || !strings.Contains(q, TokenParam) {
		return uri
	}
	fields := strings.Split(q, "&")
	for i, f := range fields {
		if name, _, _ := strings.Cut(f, "="); name == TokenParam {
			fields[i] = TokenParam + "=" + placeholder
		}
	}
	return path + "?" + strings.Join(fields, "&")
}

// TokenPingback adds the token to the pingback URL an in.php submission
// carries (the pingback field of its urlencoded or multipart body, else of
// its query), changing nothing else: the token, escaped as the field is,
// is appended to the field's value. It returns the new query and body and
// the pingback URL as the app gave it (unescaped). ok is false, and
// nothing changes, when the submission has no pingback field, more than
// one, a pingback URL with a fragment or a token already, or, in the
// query, a pingback URL with a query of its own (2captcha: a GET
// submission keeps only the first field of such a URL, so a second one
// could make the URL the provider calls differ from the app's).
func TokenPingback(rawQuery, contentType string, body []byte, token string) (query string, newBody []byte, pingback string, ok bool) {
	if len(body) > 0 {
		ct, params, _ := mime.ParseMediaType(contentType)
		switch ct {
		case "application/x-www-form-urlencoded":
			if nb, pb, found, ok := tokenURLEncoded(string(body), token, false); found {
				if !ok {
					return rawQuery, body, "", false
				}
				return rawQuery, []byte(nb), pb, true
			}
		case "multipart/form-data":
			if nb, pb, found, ok := tokenMultipart(body, params["boundary"], token); found {
				if !ok {
					return rawQuery, body, "", false
				}
				return rawQuery, nb, pb, true
			}
		}
	}
	nq, pb, found, ok := tokenURLEncoded(rawQuery, token, true)
	if !found || !ok {
		return rawQuery, body, "", false
	}
	return nq, body, pb, true
}

// tokenURLEncoded adds the token to the pingback field of an urlencoded
// string. found reports a pingback field (ok then says whether the token
// was added); inQuery refuses a pingback URL with a query of its own.
func tokenURLEncoded(s, token string, inQuery bool) (out, pingback string, found, ok bool) {
	fields := strings.Split(s, "&")
	at := -1
	for i, f := range fields {
		name, _, _ := strings.Cut(f, "=")
		if unescapeLenient(name) == "pingback" {
			if at >= 0 {
				return "", "", true, false // repeated: the provider decides which
			}
			at = i
		}
	}
	if at < 0 {
		return "", "", false, false
	}
	_, raw, _ := strings.Cut(fields[at], "=")
	pingback = unescapeLenient(raw)
	if pingback == "" || (inQuery && strings.Contains(pingback, "?")) {
		return "", "", true, false
	}
	tokened, ok := AddToken(pingback, token)
	if !ok {
		return "", "", true, false
	}
	fields[at] += url.QueryEscape(tokened[len(pingback):])
	return strings.Join(fields, "&"), pingback, true, true
}

// unescapeLenient unescapes an urlencoded name or value as PHP does: '+'
// is a space, and a malformed escape is kept as it is.
func unescapeLenient(s string) string {
	if v, err := url.QueryUnescape(s); err == nil {
		return v
	}
	return s
}

// tokenMultipart adds the token to the content of the pingback part of a
// multipart body (a part named "pingback" without a filename). found
// reports such a part.
func tokenMultipart(body []byte, boundary, token string) (out []byte, pingback string, found, ok bool) {
	if boundary == "" {
		return nil, "", false, false
	}
	delim := []byte("\r\n--" + boundary)
	// Parts start after a delimiter line; the first delimiter may open
	// the body without the leading CRLF.
	b := append([]byte("\r\n"), body...)
	at, end := -1, -1
	for i := 0; ; {
		j := bytes.Index(b[i:], delim)
		if j < 0 {
			break
		}
		start := i + j + len(delim)
		if bytes.HasPrefix(b[start:], []byte("--")) {
			break // the closing delimiter
		}
		next := bytes.Index(b[start:], delim)
		if next < 0 {
			return nil, "", false, false // no closing delimiter
		}
		part := b[start : start+next]
		hdrEnd := bytes.Index(part, []byte("\r\n\r\n"))
		if hdrEnd >= 0 && partName(part[:hdrEnd]) == "pingback" {
			if at >= 0 {
				return nil, "", true, false
			}
			at, end = start+hdrEnd+4, start+next
		}
		i = start + next
	}
	if at < 0 {
		return nil, "", false, false
	}
	pingback = string(b[at:end])
	tokened, ok := AddToken(pingback, token)
	if pingback == "" || !ok {
		return nil, "", true, false
	}
	out = make([]byte, 0, len(b)+len(tokened)-len(pingback))
	out = append(out, b[2:end]...)
	out = append(out, tokened[len(pingback):]...)
	return append(out, b[end:]...), pingback, true, true
}

// partName is the form field name of a multipart part's headers, "" for
// a file part or headers without a form-data disposition.
func partName(headers []byte) string {
	for line := range strings.SplitSeq(string(headers), "\r\n") {
		name, value, ok := strings.Cut(line, ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "Content-Disposition") {
			continue
		}
		d, params, err := mime.ParseMediaType(strings.TrimSpace(value))
		if err != nil || d != "form-data" {
			return ""
		}
		if _, file := params["filename"]; file {
			return ""
		}
		return params["name"]
	}
	return ""
}

// TokenCallbackURL adds the token to the callbackUrl of a createTask
// request, in place: the member's string value is replaced by the
// tokened URL, every other byte unchanged. It returns the new body and
// the callbackUrl as the app gave it; ok is false when the request's
// top-level callbackUrl is not one non-empty string, or AddToken refuses
// it.
func TokenCallbackURL(body []byte, token string) (newBody []byte, callback string, ok bool) {
	if !isObject(body) {
		return nil, "", false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	_, _ = dec.Token() // '{'
	start, end := -1, -1
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, "", false
		}
		key, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, "", false
		}
		if key != "callbackUrl" {
			continue
		}
		if start >= 0 || json.Unmarshal(v, &callback) != nil || callback == "" {
			return nil, "", false
		}
		end = int(dec.InputOffset())
		start = end - len(v)
	}
	if start < 0 {
		return nil, "", false
	}
	tokened, ok := AddToken(callback, token)
	if !ok {
		return nil, "", false
	}
	out := make([]byte, 0, len(body)+len(tokened)-len(callback))
	out = append(out, body[:start]...)
	out = append(out, quote(tokened)...)
	return append(out, body[end:]...), callback, true
}
