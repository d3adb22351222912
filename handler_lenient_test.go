package pingback

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestReceiveLenientForms: pingbacks that Go's url.ParseQuery refuses but
// PHP and Node accept (a ';' in a value, malformed '%' escapes, bytes that
// are not UTF-8) are answered 200 "OK", stored with the code as PHP reads
// it, and reach the app byte-identical: body and RequestURI as sent.
func TestReceiveLenientForms(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", routesSite(
		pbRoute{"/captchaai", "captchaai", "", app.hostPort()},
		pbRoute{"/2captcha", "2captcha", "", app.hostPort()},
	))
	const form = "application/x-www-form-urlencoded"
	mpType, mpBody := multipartBody(t, "id", "7105", "code", "x=1,y=2;x=3,y=4")

	tests := []struct {
		name        string
		provider    string
		method      string
		target      string
		contentType string
		body        []byte
		id, code    string
	}{
		{name: "semicolon in a POST body", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha", contentType: form,
			body: []byte("id=7101&code=x=1,y=2;x=3,y=4"), id: "7101", code: "x=1,y=2;x=3,y=4"},
		{name: "semicolon in a GET query", provider: "captchaai", method: http.MethodGet,
			target: "/captchaai?id=7102&code=x=1,y=2;x=3,y=4", id: "7102", code: "x=1,y=2;x=3,y=4"},
		{name: "semicolon in the query of a POST", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha?tag=a;b", contentType: form,
			body: []byte("id=7103&code=a;b"), id: "7103", code: "a;b"},
		{name: "plus, escapes and malformed escapes in a query", provider: "captchaai", method: http.MethodGet,
			target: "/captchaai?id=7104&code=a+b%2B%3B%zz%4%", id: "7104", code: "a b+;%zz%4%"},
		{name: "semicolon in the query of a multipart POST", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha?tag=a;b", contentType: mpType, body: mpBody, id: "7105", code: "x=1,y=2;x=3,y=4"},
		{name: "raw and escaped bytes that are not UTF-8", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha", contentType: form,
			body: []byte("id=7106&code=\xff\xfe;%FF%80\x00+%"), id: "7106", code: "\xff\xfe;\xff\x80\x00 %"},
		{name: "raw bytes that are not UTF-8 in a query", provider: "captchaai", method: http.MethodGet,
			target: "/captchaai?id=7107&code=\xff;x", id: "7107", code: "\xff;x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newTestRequest(t, tc.method, tc.target, tc.contentType, tc.body)
			status, body, _ := doRequest(t, req)
			if status != http.StatusOK || body != "OK" {
				t.Fatalf("provider got %d %q, want 200 \"OK\"", status, body)
			}
			key := tc.provider + ":" + tc.id
			waitFor(t, 5*time.Second, "the app to receive "+key, func() bool { return app.count(key) == 1 })
			for _, seen := range app.requests() {
				if seen.Header.Get(HeaderIdempotencyKey) != key {
					continue
				}
				if seen.Method != tc.method || seen.URI != tc.target {
					t.Errorf("app saw %s %q, want %s %q", seen.Method, seen.URI, tc.method, tc.target)
				}
				if seen.Body != string(tc.body) {
					t.Errorf("app saw body %q, want %q", seen.Body, tc.body)
				}
			}
			rec := waitState(t, tc.provider, tc.id)
			if rec.State != store.StateDelivered || rec.Code != storedString(tc.code) {
				t.Errorf("record: state %s, code %q; want delivered, %q", rec.State, rec.Code, storedString(tc.code))
			}
			if rec.Request.URI != storedString(tc.target) || string(rec.Request.Body) != string(tc.body) {
				t.Errorf("stored request %q %q, want %q %q", rec.Request.URI, rec.Request.Body, storedString(tc.target), tc.body)
			}
		})
	}
}

// storedString is s as the store gives it back in a string field of a
// record (Code, Request.URI, header values).
//
// The store keeps string fields byte for byte (its binary encoding; the
// JSON of format 2 coerced bytes that are not UTF-8 to U+FFFD), so the
// stored code and URI are what arrived, and a replay sends the same URI.
func storedString(s string) string { return s }
