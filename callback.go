package pingback

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// callback is a parsed pingback: the task id, its result and the raw body.
type callback struct {
	id   string
	code string
	body []byte
	// answer is a JSON callback's body, the provider's whole answer (nil
	// for a form callback): stored beside code.
	answer []byte
}

// badRequest is a client error: the status and a short plain-text reason.
type badRequest struct {
	status int
	reason string
}

func (e *badRequest) Error() string { return e.reason }

// readCallback reads and parses a pingback, in the forms of
// internal/protocol (sources in docs/protocols.md): GET with query fields id
// and code (CaptchaAI), or POST with the same fields form-encoded (2captcha,
// rucaptcha) as application/x-www-form-urlencoded or multipart/form-data;
// and, for providers with a JSON API, POST application/json (the
// anti-captcha family's getTaskResult answer with taskId, and the other
// plausible shapes ParseJSONCallback takes). In a form POST, body fields win
// over query fields of the same name. Query and urlencoded body are read as
// parseURLEncoded reads them: split on '&' only, so a ';' in a code is data.
// The body is read whole, up to maxBody bytes, and returned exactly as sent.
// Errors are *badRequest: 405 for other methods, 413 for a body over
// maxBody, 415 for a body of another content type, 400 for a missing or
// repeated field, a malformed id, a malformed Content-Type, multipart or
// JSON body. A JSON callback that names a task but carries no result (an
// errorId above 0 that is not a task-final error) is a
// *protocol.NotResultError.
func readCallback(w http.ResponseWriter, r *http.Request, p provider, maxBody int64) (callback, error) {
	var cb callback
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		w.Header().Set("Allow", "GET, POST")
		return cb, &badRequest{http.StatusMethodNotAllowed, "method not allowed: use GET or POST"}
	}
	tooBig := &badRequest{http.StatusRequestEntityTooLarge, fmt.Sprintf("body too large: at most %d bytes", maxBody)}
	if r.ContentLength > maxBody {
		return cb, tooBig
	}
	if r.Body != nil && r.Body != http.NoBody {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return cb, tooBig
		}
		if err != nil {
			return cb, &badRequest{http.StatusBadRequest, "reading body: " + err.Error()}
		}
		cb.body = body
	}

	// JSON for providers with a JSON API: a JSON Content-Type, or a body
	// that is a JSON object under another (or no) type, since the format
	// of some providers' callbacks is undocumented: a callback with a
	// recognisable task id and result is never refused for its type.
	var pcb protocol.Callback
	var err error
	ct := r.Header.Get("Content-Type")
	jsonAPI := r.Method == http.MethodPost && len(cb.body) > 0 && p.Has(protocol.JSON)
	if jsonAPI && (isJSONBody(ct) || looksLikeJSONObject(cb.body)) {
		pcb, err = p.ParseJSONCallback(cb.body)
		var notResult *protocol.NotResultError
		switch {
		case err == nil:
			cb.id, cb.code, cb.answer = pcb.ID, pcb.Code, pcb.Answer
			return cb, nil
		case errors.As(err, &notResult):
			// A task's id with an error that is not its outcome: the
			// handler answers 200 and stores nothing.
			return cb, err
		case isJSONBody(ct):
			return cb, &badRequest{http.StatusBadRequest, err.Error()}
		}
		// A JSON object under another type without a callback in it:
		// read as that type says.
	}
	form, err := parseFields(r, cb.body, maxBody)
	if err != nil {
		return cb, err
	}
	if pcb, err = p.ParseFormCallback(form); err != nil {
		return cb, &badRequest{http.StatusBadRequest, err.Error()}
	}
	cb.id, cb.code, cb.answer = pcb.ID, pcb.Code, pcb.Answer
	return cb, nil
}

// looksLikeJSONObject reports whether body is one JSON object.
func looksLikeJSONObject(body []byte) bool {
	b := bytes.TrimLeft(body, " \t\r\n")
	return len(b) > 0 && b[0] == '{' && json.Valid(body)
}

// isJSONBody reports whether a Content-Type names JSON: application/json,
// or any application/*+json.
func isJSONBody(contentType string) bool {
	ct, _, err := mime.ParseMediaType(contentType)
	return err == nil && (ct == "application/json" || strings.HasPrefix(ct, "application/") && strings.HasSuffix(ct, "+json"))
}

// parseFields returns the request's fields: the query for GET; for POST the
// form body (if any) merged over the query. The query and an urlencoded body
// never fail to parse (parseURLEncoded); multipart bodies are read by the
// standard library. Errors are *badRequest: 400 for a malformed Content-Type
// or multipart body, 415 for a body of another type.
func parseFields(r *http.Request, body []byte, maxBody int64) (url.Values, error) {
	query := parseURLEncoded(r.URL.RawQuery)
	if r.Method == http.MethodGet || len(body) == 0 {
		return query, nil
	}
	ct, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil && r.Header.Get("Content-Type") != "" {
		return nil, &badRequest{http.StatusBadRequest, "malformed Content-Type"}
	}
	switch ct {
	case "application/x-www-form-urlencoded":
		return mergeQuery(parseURLEncoded(string(body)), query), nil
	case "multipart/form-data":
		if params["boundary"] == "" {
			return nil, &badRequest{http.StatusBadRequest, "multipart body without boundary"}
		}
		// Parse a shadow request so the original stays untouched for the
		// app. Its query is left out: the fields of the multipart body
		// are all that is wanted of it.
		shadow := &http.Request{
			Method:        http.MethodPost,
			URL:           &url.URL{},
			Header:        http.Header{"Content-Type": r.Header["Content-Type"]},
			Body:          io.NopCloser(bytes.NewReader(body)),
			ContentLength: int64(len(body)),
		}
		// Everything fits in memory: the body is already bounded by maxBody.
		if err := shadow.ParseMultipartForm(maxBody + 1); err != nil {
			return nil, &badRequest{http.StatusBadRequest, "malformed multipart body"}
		}
		_ = shadow.MultipartForm.RemoveAll() // no temp files at this size; be sure
		return mergeQuery(shadow.MultipartForm.Value, query), nil
	default:
		return nil, &badRequest{http.StatusUnsupportedMediaType, "unsupported Content-Type: use application/x-www-form-urlencoded or multipart/form-data"}
	}
}

// mergeQuery adds to body the query fields it lacks: a body field wins over a
// query field of the same name.
func mergeQuery(body, query url.Values) url.Values {
	out := make(url.Values, len(body)+len(query))
	for k, v := range query {
		out[k] = v
	}
	for k, v := range body {
		out[k] = v
	}
	return out
}

// notResult answers a JSON callback that names a task but carries no
// result for it (errorId above 0 with an account, key, rate, server or
// unknown-task error, or a code the protocol package does not know): 200,
// so the provider neither retries nor flags the URL, and nothing is stored
// or forwarded. A tracked task stays pending: the poller asks
// getTaskResult and delivers the real outcome (a result, a task-final
// error, or the task expires). The callback is logged at warn level with
// its task id and code, and counted as callbacks{result="not_result"}.
func (h *Handler) notResult(w http.ResponseWriter, nr *protocol.NotResultError) error {
	h.app.countReceived(h.Provider, "not_result")
	h.logger.Warn("callback carries an error that is not the task's outcome: answered 200, not stored or forwarded; a tracked task is still polled",
		zap.String("provider", h.Provider), zap.String("id", nr.ID),
		zap.String("kind", nr.Answer.Kind.String()), zap.String("code", nr.Answer.Code))
	return writeText(w, http.StatusOK, "OK")
}

// parseURLEncoded parses an application/x-www-form-urlencoded body or a URL
// query string (the part after '?', as in url.URL.RawQuery) into its
// fields. It never fails: every input has one reading, the one PHP and Node
// give it, so a pingback that those accept is not lost here.
//
// Shape: pairs separated by '&', each "name=value" or a bare "name":
//
//	id=123&code=x=1,y=2;x=3,y=4&flag
//	→ id: ["123"], code: ["x=1,y=2;x=3,y=4"], flag: [""]
//
// The rules, as the WHATWG URL Standard's application/x-www-form-urlencoded
// parser (https://url.spec.whatwg.org/#urlencoded-parsing) has them, which is
// what Node's URLSearchParams implements:
//
//   - Only '&' separates pairs; ';' is data. PHP splits POST bodies on '&'
//     and query strings on arg_separator.input, '&' by default
//     (https://www.php.net/manual/en/ini.core.php#ini.arg-separator.input);
//     Node's querystring.parse defaults to sep '&'
//     (https://nodejs.org/api/querystring.html#querystringparsestr-sep-eq-options).
//     Go's url.ParseQuery refuses a pair holding ';' since Go 1.17
//     (https://go.dev/issue/25192), which is why this parser exists.
//   - Empty pairs ("a=1&&b=2", a leading or trailing '&') are skipped.
//   - A pair splits at its first '='; the value may hold more '='. A pair
//     without '=' is a name with the empty value.
//   - In names and values '+' is a space and %XX (two hex digits, either
//     case) is that byte. Any other '%' ("%zz", "%4", a trailing '%') stays
//     as it is, as in the WHATWG percent-decode, PHP's urldecode
//     (https://www.php.net/manual/en/function.urldecode.php) and Node's
//     querystring.unescape.
//   - Bytes are kept as they are: a name or value that is not valid UTF-8
//     (raw bytes ≥ 0x80, or escapes of them) is not replaced, as in PHP,
//     where strings are bytes. URLSearchParams and querystring would turn
//     it into U+FFFD; that would change the code the app receives.
//   - An empty name ("=x") is kept as the name "", as WHATWG and Node keep
//     it (PHP drops it); nothing the pingback reads has that name.
//   - A repeated name keeps every value, in order, as WHATWG and Node do
//     (PHP keeps the last); readCallback refuses a repeated id or code.
//
// PHP's own rewriting of names (spaces and dots to '_', "a[]" to arrays)
// is not followed: names are taken literally.
func parseURLEncoded(s string) url.Values {
	fields := make(url.Values)
	for s != "" {
		var pair string
		pair, s, _ = strings.Cut(s, "&")
		if pair == "" {
			continue
		}
		name, value, _ := strings.Cut(pair, "=")
		name = unescapeURLEncoded(name)
		fields[name] = append(fields[name], unescapeURLEncoded(value))
	}
	return fields
}

// unescapeURLEncoded decodes one name or value of a form body or query:
// '+' is a space, %XX with two hex digits is that byte, every other byte
// (a '%' that starts no such escape included) is kept. "a+b%2B%3B%zz%"
// gives "a b+;%zz%".
func unescapeURLEncoded(s string) string {
	if !strings.ContainsAny(s, "+%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b = append(b, ' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// unhex is the value of the hex digit c (isHex(c) holds).
func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}
