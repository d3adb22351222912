package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// The legacy in.php / res.php protocol of 2captcha, rucaptcha and
// CaptchaAI (https://2captcha.com/2captcha-api,
// https://docs.captchaai.com/pages/err_handling).

// TokenMethods are in.php methods whose answers never contain "|", so their
// results can be fetched in bulk with res.php?ids= and split on "|".
// FunCaptcha and KeyCaptcha answers, coordinates and rotate answers do
// contain "|" (https://2captcha.com/2captcha-api#solving_funcaptcha_new).
var TokenMethods = map[string]bool{
	"userrecaptcha": true,
	"hcaptcha":      true,
	"turnstile":     true,
}

// resJSON is res.php's and in.php's json=1 answer: {"status":1,
// "request":...}. request is a string, but may be an object (Amazon WAF,
// GeeTest) or a number (CaptchaAI's ids).
type resJSON struct {
	Status  json.Number     `json:"status"`
	Request json.RawMessage `json:"request"`
}

func decodeResJSON(body []byte) (resJSON, bool) {
	var ra resJSON
	if json.Unmarshal(body, &ra) != nil || ra.Request == nil || string(ra.Request) == "null" {
		return ra, false
	}
	return ra, true
}

func (ra resJSON) ok() bool { return ra.Status.String() == "1" }

// requestText turns the JSON "request" member into the code string: a JSON
// string as is, anything else (a number, an object) as its JSON text.
func requestText(raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	return string(raw)
}

// ParseInAnswer reads the task id from in.php's answer: plain `OK|<id>` or
// JSON `{"status":1,"request":<id>}`, the id a string or a number
// (https://2captcha.com/2captcha-api#solving_normal_captcha; CaptchaAI
// sends numbers for userrecaptcha).
func ParseInAnswer(body []byte) (string, bool) {
	body = bytes.TrimSpace(body)
	if id, ok := bytes.CutPrefix(body, []byte("OK|")); ok {
		return string(id), len(id) > 0
	}
	ra, ok := decodeResJSON(body)
	if !ok || !ra.ok() {
		return "", false
	}
	return jsonID(ra.Request)
}

// jsonID reads a task id given as a JSON string or a non-negative JSON
// integer, returned as the decimal string.
func jsonID(raw json.RawMessage) (string, bool) {
	var id string
	if json.Unmarshal(raw, &id) == nil {
		return id, id != ""
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		if _, err := strconv.ParseUint(n.String(), 10, 64); err == nil {
			return n.String(), true
		}
	}
	return "", false
}

// ErrNotProtocol is returned for a body that is not a protocol answer (an
// HTML error page, say): the caller backs off, as the providers advise
// ("make a 5 seconds timeout and then retry",
// https://2captcha.com/2captcha-api#error_handling).
var ErrNotProtocol = errors.New("not a protocol answer")

// ParseResAnswer parses a json=1 res.php?action=get answer for n ids.
// Single: status 1 means a result (Raw is then the whole answer, kept so it
// can be reproduced exactly: structured request values, extra members such
// as Turnstile's useragent); status 0 carries CAPCHA_NOT_READY or an error.
// Bulk: request is the elements joined with "|" in the order of ids (the
// shape third-party clients read; the documentation gives no example); a
// status-0 bulk answer is one code for the whole request.
func ParseResAnswer(body []byte, n int) ([]Answer, error) {
	ra, ok := decodeResJSON(body)
	if !ok {
		return nil, fmt.Errorf("res.php: %w (%d bytes)", ErrNotProtocol, len(body))
	}
	text := requestText(ra.Request)
	if !ra.ok() {
		a := ClassifyLegacy(text)
		if a.Kind == Result {
			a = Answer{Kind: Backoff, Code: text} // status 0 is never a result
		}
		return []Answer{a}, nil
	}
	if n == 1 && text != "" { // an empty one is classified below: never a result
		return []Answer{{Kind: Result, Code: text, Raw: bytes.Clone(trimJSONSpace(body))}}, nil
	}
	parts := strings.Split(text, "|")
	out := make([]Answer, len(parts))
	for i, p := range parts {
		out[i] = ClassifyLegacy(p)
	}
	return out, nil
}

// SeenResAnswer reads a result or a task-final error from a res.php
// ?action=get answer the app asked for itself, plain (`OK|<answer>`, split
// on the first "|" only: answers may contain "|") or JSON. Raw is the whole
// answer for a JSON one.
func SeenResAnswer(body []byte) (Answer, bool) {
	body = bytes.TrimSpace(body)
	if res, ok := bytes.CutPrefix(body, []byte("OK|")); ok {
		return Answer{Kind: Result, Code: string(res)}, len(res) > 0
	}
	if taskErrors[string(body)] {
		return Answer{Kind: TaskError, Code: string(body)}, true
	}
	ra, ok := decodeResJSON(body)
	if !ok {
		return Answer{}, false
	}
	text := requestText(ra.Request)
	switch {
	case ra.ok() && text != "":
		return Answer{Kind: Result, Code: text, Raw: bytes.Clone(body)}, true
	case taskErrors[text]:
		return Answer{Kind: TaskError, Code: text, Raw: bytes.Clone(body)}, true
	}
	return Answer{}, false
}

// LocalResAnswer is the answer to res.php?action=get for a result the
// plugin holds, as the provider would give it. raw is the provider's whole
// JSON answer when one was kept. With asJSON (json=1) the kept answer is
// returned byte for byte; without one, {"status":1,"request":<code>} (the
// code as a JSON string, or as the object it is the JSON text of) or
// {"status":0,"request":"<error>"}. Plain (json=0): `OK|<code>`, or the bare
// error code; a structured result (GeeTest, Amazon WAF), which res.php
// always answers in JSON, is answered as its kept JSON answer.
func LocalResAnswer(code string, raw []byte, asJSON bool) (body []byte, contentType string) {
	isErr := strings.HasPrefix(code, "ERROR")
	rawOK := len(raw) > 0 && raw[0] == '{' && json.Valid(raw)
	structured := len(code) > 0 && code[0] == '{' && json.Valid([]byte(code))
	switch {
	case rawOK && (asJSON || structured):
		return raw, "application/json"
	case !asJSON && isErr:
		return []byte(code), "text/plain"
	case !asJSON:
		return []byte("OK|" + code), "text/plain"
	}
	status := 1
	if isErr {
		status = 0
	}
	request := json.RawMessage(quote(code))
	if structured {
		request = compact([]byte(code))
	}
	b, _ := json.Marshal(struct {
		Status  int             `json:"status"`
		Request json.RawMessage `json:"request"`
	}{status, request})
	return b, "application/json"
}

// ExtraFields returns the members of a kept res.php JSON answer besides
// status and request (Turnstile's useragent, say) as strings, in the order
// they appear: a polled delivery carries them as form fields after id and
// code (an assumption: the pingback format documents only id and code).
func ExtraFields(raw []byte) [][2]string {
	if len(raw) == 0 {
		return nil
	}
	var out [][2]string
	_ = eachMember(raw, func(key string, val json.RawMessage) {
		if key == "status" || key == "request" {
			return
		}
		out = append(out, [2]string{key, requestText(val)})
	})
	return out
}

// LegacyCallbackQuery returns the query of a GET pingback to a URL whose own
// raw query is rawQuery: that query exactly as given, then id and code
// (and extra fields) appended, the way the provider appends them.
func LegacyCallbackQuery(rawQuery, id, code string, extra [][2]string) string {
	var b strings.Builder
	b.WriteString(rawQuery)
	add := func(k, v string) {
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "&") {
			b.WriteByte('&')
		}
		b.WriteString(url.QueryEscape(k) + "=" + url.QueryEscape(v))
	}
	add("id", id)
	add("code", code)
	for _, kv := range extra {
		add(kv[0], kv[1])
	}
	return b.String()
}

// LegacyCallbackForm returns the body of a POST pingback: the form
// id=<id>&code=<code> (https://2captcha.com/2captcha-api#pingback), then
// any extra fields.
func LegacyCallbackForm(id, code string, extra [][2]string) []byte {
	return []byte(LegacyCallbackQuery("", id, code, extra))
}

// eachMember calls fn for each member of a top-level JSON object, in order.
func eachMember(raw []byte, fn func(key string, val json.RawMessage)) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return ErrNotProtocol
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := t.(string)
		var val json.RawMessage
		if err := dec.Decode(&val); err != nil {
			return err
		}
		fn(key, val)
	}
	return nil
}

func quote(s string) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return bytes.TrimRight(b.Bytes(), "\n")
}

func compact(raw []byte) []byte {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return raw
	}
	return b.Bytes()
}
