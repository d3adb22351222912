package pingback

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// fuzzMaxBody is the max_body the fuzzer runs with: small, so that the
// 413 path is reached too.
const fuzzMaxBody = 1024

// refUnescape is the reference decoding of one name or value, written
// apart from unescapeURLEncoded: each '%' that starts no %XX escape is made
// "%25", and url.QueryUnescape ('+' is a space) does the rest.
func refUnescape(s string) string {
	const hex = "0123456789abcdefABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && (i+2 >= len(s) || !strings.ContainsRune(hex, rune(s[i+1])) || !strings.ContainsRune(hex, rune(s[i+2]))) {
			b.WriteString("%25")
			continue
		}
		b.WriteByte(s[i])
	}
	out, err := url.QueryUnescape(b.String())
	if err != nil {
		panic(fmt.Sprintf("refUnescape(%q): %v", s, err))
	}
	return out
}

// refFields is the reference reading of a query or urlencoded body: the
// non-empty '&'-separated pairs, each split at its first '=', decoded by
// refUnescape.
func refFields(s string) url.Values {
	fields := url.Values{}
	for _, pair := range strings.Split(s, "&") {
		if pair == "" {
			continue
		}
		kv := strings.SplitN(pair, "=", 2)
		if len(kv) == 1 {
			kv = append(kv, "")
		}
		name := refUnescape(kv[0])
		fields[name] = append(fields[name], refUnescape(kv[1]))
	}
	return fields
}

// FuzzParseURLEncoded: parseURLEncoded never fails and reads every input as
// the reference does; where url.ParseQuery accepts an input it agrees with
// it; and any name and value survive url.Values.Encode and back, byte for
// byte (';', '+', '%', raw bytes and all).
func FuzzParseURLEncoded(f *testing.F) {
	for _, s := range []string{
		"", "id=1&code=x", "id=1&code=x=1,y=2;x=3,y=4", "a=1;b=2", ";", ";;=;&;",
		"a=b+c&d+e=f", "a=%2B%2b%3B%3b%26%3D", "a=%zz", "a=%", "a=%4", "%%41", "%4%41%",
		"a=%FF%fe%80", "a=\xff\xfe\x80&\x81=\xc3\xa9", "a=%00\x00", "flag&=x&=&&", "a=1&a=2&a=",
		"%", "+", "%+", "%2", "%g0", "&%&=%=&",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := parseURLEncoded(s)
		if want := refFields(s); !reflect.DeepEqual(got, want) {
			t.Fatalf("parseURLEncoded(%q) = %q, reference %q", s, got, want)
		}
		if std, err := url.ParseQuery(s); err == nil && !reflect.DeepEqual(got, std) {
			t.Fatalf("parseURLEncoded(%q) = %q, url.ParseQuery %q", s, got, std)
		}
		want := url.Values{"code": {s, ""}, s: {s}}
		if s == "code" {
			want = url.Values{"code": {s, "", s}}
		}
		enc := url.Values{"code": {s, ""}}.Encode() + "&" + url.QueryEscape(s) + "=" + url.QueryEscape(s)
		if got := parseURLEncoded(enc); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q encoded as %q reads back as %q, want %q", s, enc, got, want)
		}
	})
}

// readCallbackRef is what a reference reading of the request's
// urlencoded fields gives readCallback: the query, with the body's fields
// merged over it for an urlencoded POST. ok is false where the reference
// does not apply (a body over fuzzMaxBody, multipart and other types).
func readCallbackRef(method, contentType, query string, body []byte) (fields url.Values, ok bool) {
	if len(body) > fuzzMaxBody || (method != http.MethodGet && method != http.MethodPost) {
		return nil, false
	}
	fields = refFields(query)
	if method == http.MethodGet || len(body) == 0 {
		return fields, true
	}
	if ct, _, err := mime.ParseMediaType(contentType); err != nil || ct != "application/x-www-form-urlencoded" {
		return nil, false
	}
	for name, vals := range refFields(string(body)) {
		fields[name] = vals
	}
	return fields, true
}

// FuzzReadCallback: whatever arrives, readCallback does not panic and
// either returns a callback that satisfies the provider's rules or a
// *badRequest with a 4xx status and a reason; it never writes the answer
// itself, and it keeps the body exactly as sent (the app must see it).
// For a query and an urlencoded body its id and code are those of the
// reference reading (readCallbackRef), and a request whose reference
// reading has one valid id and one non-empty code is accepted: no ';',
// '+', '%' sequence or raw byte makes it a 400.
func FuzzReadCallback(f *testing.F) {
	f.Add("GET", "", "id=123&code=03AGdBq24", []byte(nil))
	f.Add("GET", "", "id=123&code=ERROR_CAPTCHA_UNSOLVABLE", []byte(nil))
	f.Add("GET", "", "id=abc&code=x", []byte(nil))
	f.Add("GET", "", "id=1;code=x", []byte(nil))
	f.Add("POST", "application/x-www-form-urlencoded", "", []byte("id=987654321&code=TOKEN"))
	f.Add("POST", "application/x-www-form-urlencoded; charset=utf-8", "id=1", []byte("code=a%20b&id=2"))
	f.Add("POST", "application/x-www-form-urlencoded", "", []byte("id=1&id=2&code=x"))
	f.Add("POST", "application/x-www-form-urlencoded", "", []byte("%zz"))
	f.Add("POST", "text/plain", "id=1&code=x", []byte("hello"))
	f.Add("POST", "", "id=1&code=x", []byte("body without a type"))
	f.Add("POST", "multipart/form-data", "", []byte("--x\r\n\r\n--x--"))
	f.Add("PUT", "", "id=1&code=x", []byte(nil))
	f.Add("POST", "application/x-www-form-urlencoded", "", bytes.Repeat([]byte("a"), fuzzMaxBody+1))
	f.Add("GET", "", "id=11&code=x=1,y=2;x=3,y=4", []byte(nil))
	f.Add("POST", "application/x-www-form-urlencoded", "", []byte("id=12&code=x=1,y=2;x=3,y=4"))
	f.Add("POST", "application/x-www-form-urlencoded", "tag=a;b;c", []byte("id=13&code=y;"))
	f.Add("GET", "", ";id=14&code=x;&;", []byte(nil))
	f.Add("GET", "", "id=1%3B5&code=x", []byte(nil))
	f.Add("GET", "", "id=16&code=a+b%2B%3B%3b%26", []byte(nil))
	f.Add("GET", "", "id=17&code=%zz%4%G0%", []byte(nil))
	f.Add("POST", "application/x-www-form-urlencoded", "", []byte("id=18&code=%%%"))
	f.Add("POST", "application/x-www-form-urlencoded", "", []byte("id=19&code=\xff\xfe\x80;%FF%80\x00"))
	f.Add("GET", "", "id=20&code=\xc3\xa9\xff", []byte(nil))
	f.Add("GET", "", "&&id=21&&code=+&", []byte(nil))
	f.Add("POST", "application/x-www-form-urlencoded", "id=22;code=q", []byte("code=%"))
	ct, body := testkit.Multipart(f, nil, "id", "23", "code", "a;b")
	f.Add("POST", ct, "x=1;y", body)
	ct, body = testkit.Multipart(f, nil, "id", "42", "code", "03AGdBq24")
	f.Add("POST", ct, "", body)
	ct, body = testkit.Multipart(f, nil, "code", "solved")
	f.Add("POST", ct, "id=42", body)
	ct, body = testkit.Multipart(f, nil, "id", "42", "id", "43", "code", "x")
	f.Add("POST", ct, "", body)

	f.Fuzz(func(t *testing.T, method, contentType, query string, body []byte) {
		r := &http.Request{
			Method:        method,
			URL:           &url.URL{Path: "/cb", RawQuery: query},
			Header:        http.Header{},
			Body:          io.NopCloser(bytes.NewReader(body)),
			ContentLength: int64(len(body)),
			Host:          "example.com",
		}
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		w := httptest.NewRecorder()
		p := mustProvider("captchaai")
		cb, err := readCallback(w, r, p, fuzzMaxBody)

		if w.Body.Len() != 0 {
			t.Errorf("readCallback wrote a response body %q", w.Body.String())
		}
		ref, refOK := readCallbackRef(method, contentType, query, body)
		if refOK && len(ref["id"]) == 1 && p.ValidID(ref["id"][0]) && len(ref["code"]) == 1 && ref["code"][0] != "" && err != nil {
			t.Fatalf("refused (%v), but the reference reads id %q code %q", err, ref["id"][0], ref["code"][0])
		}
		if err != nil {
			var bad *badRequest
			if !errors.As(err, &bad) {
				t.Fatalf("error %v (%T) is not a *badRequest", err, err)
			}
			if bad.status < 400 || bad.status > 499 || bad.reason == "" {
				t.Fatalf("bad request %d %q: want a 4xx status and a reason", bad.status, bad.reason)
			}
			if method != http.MethodGet && method != http.MethodPost && bad.status != http.StatusMethodNotAllowed {
				t.Errorf("method %q: got %d, want 405", method, bad.status)
			}
			return
		}
		if method != http.MethodGet && method != http.MethodPost {
			t.Fatalf("method %q accepted", method)
		}
		if len(body) > fuzzMaxBody {
			t.Fatalf("a %d-byte body accepted with max_body %d", len(body), fuzzMaxBody)
		}
		if !p.ValidID(cb.id) || cb.code == "" {
			t.Fatalf("accepted id %q code %q", cb.id, cb.code)
		}
		if !bytes.Equal(cb.body, body) {
			t.Fatalf("body changed: got %q, want %q", cb.body, body)
		}
		if refOK && (!slices.Equal(ref["id"], []string{cb.id}) || !slices.Equal(ref["code"], []string{cb.code})) {
			t.Fatalf("accepted id %q code %q, the reference reads id %q code %q", cb.id, cb.code, ref["id"], ref["code"])
		}
	})
}

// countingBody counts reads so a test can tell whether a body was read.
type countingBody struct {
	r     io.Reader
	reads int
}

func (c *countingBody) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

func TestReadCallback(t *testing.T) {
	const maxBody = 512
	mpType, mpBody := testkit.Multipart(t, nil, "id", "555", "code", "multi part")
	mpCodeType, mpCodeBody := testkit.Multipart(t, nil, "code", "from body")
	for _, tc := range []struct {
		name        string
		method      string
		target      string
		contentType string
		body        string
		chunked     bool // unknown Content-Length

		status   int // 0: accepted
		reason   string
		id, code string
	}{
		{name: "GET query", method: "GET", target: "/cb?id=123&code=TOKEN", id: "123", code: "TOKEN"},
		{name: "error code is a result", method: "GET", target: "/cb?id=123&code=ERROR_CAPTCHA_UNSOLVABLE", id: "123", code: "ERROR_CAPTCHA_UNSOLVABLE"},
		{name: "urlencoded POST", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: "id=77&code=03AG%2Bx", id: "77", code: "03AG+x"},
		{name: "body field wins over query", method: "POST", target: "/cb?id=1&code=FROM_QUERY", contentType: "application/x-www-form-urlencoded", body: "id=2&code=FROM_BODY", id: "2", code: "FROM_BODY"},
		{name: "id in query, code in body", method: "POST", target: "/cb?id=31", contentType: "application/x-www-form-urlencoded", body: "code=solved", id: "31", code: "solved"},
		{name: "multipart POST", method: "POST", target: "/cb", contentType: mpType, body: string(mpBody), id: "555", code: "multi part"},
		{name: "multipart code, id in query", method: "POST", target: "/cb?id=8", contentType: mpCodeType, body: string(mpCodeBody), id: "8", code: "from body"},
		{name: "POST without body uses query", method: "POST", target: "/cb?id=9&code=q", id: "9", code: "q"},
		{name: "semicolon in a GET code", method: "GET", target: "/cb?id=61&code=x=1,y=2;x=3,y=4", id: "61", code: "x=1,y=2;x=3,y=4"},
		{name: "semicolon in a POST code", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: "id=62&code=x=1,y=2;x=3,y=4", id: "62", code: "x=1,y=2;x=3,y=4"},
		{name: "semicolon in the query of a POST", method: "POST", target: "/cb?tag=a;b&id=63", contentType: "application/x-www-form-urlencoded", body: "code=x;y", id: "63", code: "x;y"},
		{name: "semicolon in the query of a multipart POST", method: "POST", target: "/cb?tag=a;b", contentType: mpType, body: string(mpBody), id: "555", code: "multi part"},
		{name: "plus is a space, %2B a plus, %3B a semicolon", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: "id=64&code=a+b%2Bc%3Bd%3bE", id: "64", code: "a b+c;d;E"},
		{name: "malformed escapes kept", method: "GET", target: "/cb?id=65&code=%zz%4%G0%", id: "65", code: "%zz%4%G0%"},
		{name: "raw bytes kept", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: "id=66&code=\xff\xfe\x80;\xc3\xa9", id: "66", code: "\xff\xfe\x80;\xc3\xa9"},
		{name: "escaped bytes not made UTF-8", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: "id=67&code=%FF%fe%80", id: "67", code: "\xff\xfe\x80"},
		{name: "escaped ampersand does not split", method: "GET", target: "/cb?id=68&code=a%26id=69", id: "68", code: "a&id=69"},
		{name: "empty pairs skipped", method: "GET", target: "/cb?&&id=70&&code=x&", id: "70", code: "x"},
		{name: "32-digit id", method: "GET", target: "/cb?id=" + strings.Repeat("9", 32) + "&code=x", id: strings.Repeat("9", 32), code: "x"},

		{name: "empty code", method: "GET", target: "/cb?id=1&code=", status: 400, reason: "missing code"},
		{name: "code without =", method: "GET", target: "/cb?id=1&code", status: 400, reason: "missing code"},
		{name: "repeated code", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: "id=1&code=a;b&code=c", status: 400, reason: "more than one code"},
		{name: "malformed escape in the id", method: "GET", target: "/cb?id=1%zz&code=x", status: 400, reason: "malformed id"},
		{name: "missing id", method: "GET", target: "/cb?code=x", status: 400, reason: "missing id"},
		{name: "empty code in body hides query code", method: "POST", target: "/cb?id=1&code=q", contentType: "application/x-www-form-urlencoded", body: "code=", status: 400, reason: "missing code"},
		{name: "repeated id", method: "GET", target: "/cb?id=1&id=2&code=x", status: 400, reason: "more than one id"},
		{name: "non-digit id", method: "GET", target: "/cb?id=12a&code=x", status: 400, reason: "malformed id"},
		{name: "33-digit id", method: "GET", target: "/cb?id=" + strings.Repeat("9", 33) + "&code=x", status: 400, reason: "malformed id"},
		// ';' is data, not a separator: the query is one field id="1;code=x".
		// (This used to be 400 "malformed query string".)
		{name: "semicolon is not a separator", method: "GET", target: "/cb?id=1;code=x", status: 400, reason: "missing code"},
		{name: "semicolon in the id", method: "GET", target: "/cb?id=1;2&code=x", status: 400, reason: "malformed id"},
		{name: "multipart without boundary", method: "POST", target: "/cb", contentType: "multipart/form-data", body: "--x\r\nContent-Disposition: form-data; name=\"id\"\r\n\r\n1\r\n--x--\r\n", status: 400, reason: "without boundary"},
		{name: "malformed multipart", method: "POST", target: "/cb", contentType: "multipart/form-data; boundary=zzz", body: "not multipart at all", status: 400, reason: "malformed multipart"},
		{name: "other content type", method: "POST", target: "/cb?id=1&code=x", contentType: "application/xml", body: `<id>1</id>`, status: 415, reason: "unsupported Content-Type"},
		// JSON callbacks (2captcha API v2): every plausible shape.
		{name: "JSON id and code", method: "POST", target: "/cb", contentType: "application/json", body: `{"id":"77","code":"TOKEN"}`, id: "77", code: "TOKEN"},
		{name: "JSON getTaskResult shape", method: "POST", target: "/cb", contentType: "application/json; charset=utf-8", body: `{"taskId":77,"errorId":0,"status":"ready","solution":{"token":"T","gRecaptchaResponse":"T"}}`, id: "77", code: `{"gRecaptchaResponse":"T","token":"T"}`},
		{name: "JSON task error", method: "POST", target: "/cb", contentType: "application/json", body: `{"taskId":77,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`, id: "77", code: "ERROR_CAPTCHA_UNSOLVABLE"},
		{name: "JSON without a result", method: "POST", target: "/cb", contentType: "application/json", body: `{"id":1}`, status: 400, reason: "no result"},
		{name: "JSON without an id", method: "POST", target: "/cb", contentType: "application/json", body: `{"code":"x"}`, status: 400, reason: "missing taskId"},
		{name: "JSON not an object", method: "POST", target: "/cb", contentType: "application/json", body: `[1]`, status: 400, reason: "malformed JSON"},
		// A JSON callback under another type, or none, is still a callback.
		{name: "JSON without a Content-Type", method: "POST", target: "/cb", body: `{"taskId":78,"solution":{"token":"T"}}`, id: "78", code: `{"token":"T"}`},
		{name: "JSON as text/plain", method: "POST", target: "/cb", contentType: "text/plain", body: ` {"id":79,"code":"T"}`, id: "79", code: "T"},
		{name: "JSON as a form type", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: `{"taskId":80,"code":"T"}`, id: "80", code: "T"},
		{name: "JSON object without a callback as text/plain", method: "POST", target: "/cb", contentType: "text/plain", body: `{"a":1}`, status: 415, reason: "unsupported Content-Type"},
		{name: "malformed content type", method: "POST", target: "/cb?id=1&code=x", contentType: "multipart/form-data; boundary", body: "x", status: 400, reason: "malformed Content-Type"},
		{name: "PUT", method: "PUT", target: "/cb?id=1&code=x", status: 405, reason: "use GET or POST"},
		{name: "body over max_body, length unknown", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: "id=1&code=" + strings.Repeat("x", maxBody), chunked: true, status: 413, reason: "body too large"},
		{name: "body of exactly max_body", method: "POST", target: "/cb", contentType: "application/x-www-form-urlencoded", body: "id=1&code=" + strings.Repeat("x", maxBody-10), id: "1", code: strings.Repeat("x", maxBody-10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			if tc.chunked {
				r.ContentLength = -1
			}
			w := httptest.NewRecorder()
			cb, err := readCallback(w, r, mustProvider("2captcha"), maxBody)
			if tc.status != 0 {
				var bad *badRequest
				if !errors.As(err, &bad) {
					t.Fatalf("got (%+v, %v), want a %d error", cb, err, tc.status)
				}
				if bad.status != tc.status || !strings.Contains(bad.reason, tc.reason) {
					t.Errorf("got %d %q, want %d containing %q", bad.status, bad.reason, tc.status, tc.reason)
				}
				if tc.status == http.StatusMethodNotAllowed && w.Header().Get("Allow") != "GET, POST" {
					t.Errorf("405 without Allow: GET, POST (got %q)", w.Header().Get("Allow"))
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want id %q code %q", err, tc.id, tc.code)
			}
			if cb.id != tc.id || cb.code != tc.code {
				t.Errorf("got id %q code %q, want id %q code %q", cb.id, cb.code, tc.id, tc.code)
			}
			if string(cb.body) != tc.body {
				t.Errorf("body: got %q, want the body as sent %q", cb.body, tc.body)
			}
		})
	}
}

// TestReadCallbackContentLengthOverMaxBody: a declared length above
// max_body is refused before any of the body is read.
func TestReadCallbackContentLengthOverMaxBody(t *testing.T) {
	body := &countingBody{r: strings.NewReader("id=1&code=x")}
	r := httptest.NewRequest(http.MethodPost, "/cb", body)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.ContentLength = 65
	_, err := readCallback(httptest.NewRecorder(), r, mustProvider("captchaai"), 64)
	var bad *badRequest
	if !errors.As(err, &bad) || bad.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %v, want 413", err)
	}
	if !strings.Contains(bad.reason, "at most 64 bytes") {
		t.Errorf("reason %q does not state the limit", bad.reason)
	}
	if body.reads != 0 {
		t.Errorf("the body was read %d times before refusing it", body.reads)
	}
}

// mustProvider returns a known provider.
func mustProvider(name string) provider {
	p, err := lookupProvider(name)
	if err != nil {
		panic(err)
	}
	return p
}

// FuzzReadJSONCallback: a JSON callback to a JSON-API provider is never
// refused (4xx) when one of its id keys (taskId, id, task_id) holds a valid
// task id and it carries a result (errorId absent or 0, and a non-null
// solution or a non-empty string code); an errorId callback is either a
// result (a task-final error) or a *protocol.NotResultError, never a
// stored account error; what is accepted keeps the body byte for byte.
func FuzzReadJSONCallback(f *testing.F) {
	for _, s := range []string{
		`{"taskId":5,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`,
		`{"taskId":null,"id":5,"code":"T"}`,
		`{"taskId":"x","task_id":"5","solution":{"a":1}}`,
		`{"taskId":{},"id":[],"task_id":7,"solution":"s"}`,
		`{"taskId":5,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`,
		`{"taskId":5,"errorId":1,"errorCode":"ERROR_KEY_DOES_NOT_EXIST"}`,
		`{"taskId":5,"errorId":"1"}`,
		`{"id":"5","code":""}`,
	} {
		f.Add("application/json", []byte(s))
		f.Add("text/plain", []byte(s))
	}
	p := mustProvider("anticaptcha")
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		r := &http.Request{
			Method: http.MethodPost, URL: &url.URL{Path: "/cb"}, Header: http.Header{},
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Host: "example.com",
		}
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		cb, err := readCallback(httptest.NewRecorder(), r, p, fuzzMaxBody)
		var nr *protocol.NotResultError
		var bad *badRequest
		switch {
		case errors.As(err, &nr):
			if !p.ValidID(nr.ID) || nr.Answer.Kind == protocol.TaskError || nr.Answer.Kind == protocol.Result {
				t.Fatalf("not-a-result %+v from %q", nr, body)
			}
			return
		case errors.As(err, &bad):
			if len(body) > fuzzMaxBody {
				return
			}
			var v map[string]json.RawMessage
			if !looksLikeJSONObject(body) || json.Unmarshal(body, &v) != nil {
				return
			}
			if e, ok := v["errorId"]; ok && string(e) != "0" {
				return
			}
			valid := false
			for _, k := range []string{"taskId", "id", "task_id"} {
				var s string
				var n json.Number
				switch {
				case json.Unmarshal(v[k], &s) == nil:
					valid = valid || p.ValidID(s)
				case json.Unmarshal(v[k], &n) == nil:
					valid = valid || p.ValidID(n.String())
				}
			}
			var code string
			hasResult := (v["solution"] != nil && string(v["solution"]) != "null") ||
				(json.Unmarshal(v["code"], &code) == nil && code != "")
			if valid && hasResult {
				t.Fatalf("refused %d %q, though it carries a valid id and a result: %q", bad.status, bad.reason, body)
			}
			return
		case err != nil:
			t.Fatalf("error %v (%T)", err, err)
		}
		if !p.ValidID(cb.id) || cb.code == "" || !bytes.Equal(cb.body, body) {
			t.Fatalf("accepted id %q code %q from %q", cb.id, cb.code, body)
		}
	})
}

// TestParseURLEncoded: the rules of parseURLEncoded, one case each. The
// "PHP/Node" notes say what PHP 8.2's parse_str and Node 20's
// URLSearchParams give for the same input where they differ from us.
func TestParseURLEncoded(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want url.Values
	}{
		{"empty", "", url.Values{}},
		{"two fields", "id=123&code=TOKEN", url.Values{"id": {"123"}, "code": {"TOKEN"}}},
		{"semicolon in a value", "id=1&code=x=1,y=2;x=3,y=4", url.Values{"id": {"1"}, "code": {"x=1,y=2;x=3,y=4"}}},
		{"semicolon does not split", "a=1;b=2", url.Values{"a": {"1;b=2"}}},
		{"semicolon alone", ";", url.Values{";": {""}}},
		{"semicolon in a name", "a;b=1", url.Values{"a;b": {"1"}}},
		{"plus is a space", "a=b+c&d+e=f", url.Values{"a": {"b c"}, "d e": {"f"}}},
		{"%2B is a plus", "a=%2B%2b", url.Values{"a": {"++"}}},
		{"%3B is a semicolon", "a=%3B%3b", url.Values{"a": {";;"}}},
		{"%20 is a space", "a=b%20c", url.Values{"a": {"b c"}}},
		{"escaped & and = are data", "a=%26b%3Dc", url.Values{"a": {"&b=c"}}},
		{"value holds more =", "a==b=c", url.Values{"a": {"=b=c"}}},
		{"malformed %zz kept", "a=%zz", url.Values{"a": {"%zz"}}},
		{"trailing % kept", "a=%", url.Values{"a": {"%"}}},
		{"% and one digit kept", "a=%4", url.Values{"a": {"%4"}}},
		{"% and one hex digit then a non-hex", "a=%4g", url.Values{"a": {"%4g"}}},
		{"%% then an escape", "a=%%41", url.Values{"a": {"%A"}}},
		{"malformed escape in a name", "%zz=1", url.Values{"%zz": {"1"}}},
		{"escape split by &", "a=%4&1=x", url.Values{"a": {"%4"}, "1": {"x"}}},
		{"%00 is a NUL byte", "a=%00b", url.Values{"a": {"\x00b"}}},
		// PHP: bytes as they are. Node: U+FFFD for each invalid byte.
		{"raw bytes ≥ 0x80 kept", "a=\xff\xfe\x80&\x81=\xc3\xa9", url.Values{"a": {"\xff\xfe\x80"}, "\x81": {"é"}}},
		{"escaped invalid UTF-8 kept", "a=%FF%fe%80", url.Values{"a": {"\xff\xfe\x80"}}},
		{"escaped UTF-8", "a=%C3%A9", url.Values{"a": {"é"}}},
		{"control bytes kept", "a=\x00\r\n\t", url.Values{"a": {"\x00\r\n\t"}}},
		{"name without =", "flag&a=1", url.Values{"flag": {""}, "a": {"1"}}},
		{"name with empty value", "a=", url.Values{"a": {""}}},
		// PHP drops an empty name; Node and WHATWG keep it.
		{"empty name", "=x", url.Values{"": {"x"}}},
		{"only =", "=", url.Values{"": {""}}},
		{"empty pairs skipped", "&&a=1&&&b=2&", url.Values{"a": {"1"}, "b": {"2"}}},
		{"only &", "&&&", url.Values{}},
		// PHP keeps the last; Node and WHATWG keep all, in order.
		{"repeated name keeps all values in order", "a=1&b=x&a=2&a=", url.Values{"a": {"1", "2", ""}, "b": {"x"}}},
		{"names are not rewritten", "a.b=1&c[]=2&d e=3", url.Values{"a.b": {"1"}, "c[]": {"2"}, "d e": {"3"}}},
		{"question mark and hash are data", "a=?b#c", url.Values{"a": {"?b#c"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseURLEncoded(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parseURLEncoded(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestParseURLEncodedAgreesWithParseQuery: where url.ParseQuery accepts an
// input, both read it the same way.
func TestParseURLEncodedAgreesWithParseQuery(t *testing.T) {
	for _, in := range []string{
		"", "a=1", "id=123&code=03AGdBq24PBC%2Bx_y", "a=b+c%20d", "a&b=&=c", "a=1&a=2&&b=%C3%A9",
		"x=%FF", "k=%2B%3D%26", "a==b",
	} {
		want, err := url.ParseQuery(in)
		if err != nil {
			t.Fatalf("url.ParseQuery(%q): %v", in, err)
		}
		if got := parseURLEncoded(in); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: parseURLEncoded %q, url.ParseQuery %q", in, got, want)
		}
	}
}

// TestJSONCallbackIDKeysAndErrors: a JSON callback whose taskId is null
// but whose id is valid is a result (200, stored, forwarded), not a 400;
// an errorId callback whose error is not the task's outcome (an account
// error such as ERROR_KEY_DOES_NOT_EXIST) is answered 200 and neither
// stored nor forwarded, so the tracked task stays pending and the poller
// delivers its real result, once; a task-final error is a result.
func TestJSONCallbackIDKeysAndErrors(t *testing.T) {
	const provider = "anticaptcha"
	app := newAppStub(t)
	sim := newJSONSim(t, captchasim.Config{JSONFlavor: captchasim.FlavorAntiCaptcha, DropRate: 1,
		SolveMin: 100 * time.Millisecond, SolveMax: 200 * time.Millisecond, Seed: 3})
	startJSONCaddy(t, provider, pollBlock("after 1s", "interval 5s"), sim, app, "")
	post := func(body string) trkResponse {
		return trkDo(t, http.MethodPost, "/cb/"+provider, "application/json", strings.NewReader(body))
	}

	// A null taskId beside a valid id.
	if r := post(`{"taskId":null,"id":4242,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T1"}}`); r.status != http.StatusOK {
		t.Fatalf("null taskId with a valid id answered %d %q, want 200", r.status, r.body)
	}
	if rec := getRecord(t, provider, "4242"); rec.Code != `{"gRecaptchaResponse":"T1"}` {
		t.Errorf("stored code %q", rec.Code)
	}
	testkit.WaitFor(t, 10*time.Second, "the forward", func() bool { return len(deliveriesOf(app, provider+":4242")) == 1 })

	// A task-final error is the task's result.
	if r := post(`{"taskId":4343,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`); r.status != http.StatusOK {
		t.Fatalf("task-final error callback answered %d %q", r.status, r.body)
	}
	if rec := getRecord(t, provider, "4343"); rec.Code != "ERROR_CAPTCHA_UNSOLVABLE" {
		t.Errorf("task-final error stored as %q", rec.Code)
	}

	// An account error for a tracked task: 200, nothing stored or
	// forwarded; the poller still gets the real result.
	id := createTask(t, provider)
	key := provider + ":" + id
	r := post(`{"taskId":` + id + `,"errorId":1,"errorCode":"ERROR_KEY_DOES_NOT_EXIST","errorDescription":"Account authorization key not found in the system"}`)
	if r.status != http.StatusOK {
		t.Fatalf("account error callback answered %d %q, want 200", r.status, r.body)
	}
	s := runningApp(t).store(time.Second)
	if rec, err := s.Get(t.Context(), store.Key{Provider: provider, ID: id}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("account error callback stored %+v, %v; want nothing", rec, err)
	}
	info, _ := sim.Task(id)
	testkit.WaitFor(t, 15*time.Second, "the polled result", func() bool {
		rec, err := s.Get(t.Context(), store.Key{Provider: provider, ID: id})
		return err == nil && rec.State == store.StateDelivered
	})
	got := deliveriesOf(app, key)
	if len(got) != 1 || got[0].Header.Get(HeaderSource) != "poll" || !strings.Contains(got[0].Body, info.Code) {
		t.Fatalf("app got %d deliveries (%+v), want the polled result once", len(got), got)
	}
}
