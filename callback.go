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
