package pingback

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"testing/iotest"
)

func TestParseSubmitAnswer(t *testing.T) {
	tests := []struct {
		name, body string
		id         string
		ok         bool
	}{
		{"plain", "OK|2122988149", "2122988149", true},
		{"plain with whitespace", " OK|2122988149\r\n", "2122988149", true},
		{"JSON string id", `{"status":1,"request":"2122988149"}`, "2122988149", true},
		{"JSON numeric id", `{"status":1,"request":2122988149}`, "2122988149", true},
		{"JSON numeric id beyond 2^53", `{"status":1,"request":12345678901234567890}`, "12345678901234567890", true},
		{"JSON with extra fields", `{"status":1,"request":"77","error_text":""}`, "77", true},
		{"plain error", "ERROR_ZERO_BALANCE", "", false},
		{"JSON error", `{"status":0,"request":"ERROR_ZERO_BALANCE"}`, "", false},
		{"JSON status 0 with a number", `{"status":0,"request":77}`, "", false},
		{"empty plain id", "OK|", "", false},
		{"empty JSON id", `{"status":1,"request":""}`, "", false},
		{"null request", `{"status":1,"request":null}`, "", false},
		{"no request", `{"status":1}`, "", false},
		{"negative number", `{"status":1,"request":-5}`, "", false},
		{"fraction", `{"status":1,"request":1.5}`, "", false},
		{"exponent", `{"status":1,"request":1e10}`, "", false},
		{"object request", `{"status":1,"request":{"id":"77"}}`, "", false},
		{"HTML page", "<html><body>502 Bad Gateway</body></html>", "", false},
		{"empty", "", "", false},
		{"lower-case ok", "ok|77", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := parseSubmitAnswer([]byte(tc.body))
			if id != tc.id || ok != tc.ok {
				t.Errorf("parseSubmitAnswer(%q) = %q, %v; want %q, %v", tc.body, id, ok, tc.id, tc.ok)
			}
		})
	}
}

func TestParseResultAnswer(t *testing.T) {
	tests := []struct {
		name, body string
		code       string
		ok         bool
	}{
		{"plain token", "OK|03AGdBq25-TOKEN", "03AGdBq25-TOKEN", true},
		{"plain answer with |", "OK|x=12,y=34|x=56,y=78", "x=12,y=34|x=56,y=78", true},
		{"plain answer starting with |", "OK||a", "|a", true},
		{"plain with newline", "OK|abc\n", "abc", true},
		{"JSON string", `{"status":1,"request":"03AGdBq25-TOKEN"}`, "03AGdBq25-TOKEN", true},
		{"JSON string with |", `{"status":1,"request":"a|b|c"}`, "a|b|c", true},
		{"JSON with extra fields", `{"status":1,"request":"0.4uMM","useragent":"Mozilla/5.0"}`, "0.4uMM", true},
		{"JSON object request", `{"status":1,"request":{"captcha_voucher":"v","existing_token":"t"}}`, `{"captcha_voucher":"v","existing_token":"t"}`, true},
		{"JSON number request", `{"status":1,"request":1234}`, "1234", true},
		{"plain not ready", "CAPCHA_NOT_READY", "", false},
		{"JSON not ready", `{"status":0,"request":"CAPCHA_NOT_READY"}`, "", false},
		{"plain task error", "ERROR_CAPTCHA_UNSOLVABLE", "", false},
		{"JSON task error", `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`, "", false},
		{"empty plain result", "OK|", "", false},
		{"empty JSON result", `{"status":1,"request":""}`, "", false},
		{"null request", `{"status":1,"request":null}`, "", false},
		{"HTML page", "<html>OK</html>", "", false},
		{"empty", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, ok := parseResultAnswer([]byte(tc.body))
			if code != tc.code || ok != tc.ok {
				t.Errorf("parseResultAnswer(%q) = %q, %v; want %q, %v", tc.body, code, ok, tc.code, tc.ok)
			}
		})
	}
}

func TestParseTaskError(t *testing.T) {
	tests := []struct {
		body, code string
		ok         bool
	}{
		{"ERROR_CAPTCHA_UNSOLVABLE", "ERROR_CAPTCHA_UNSOLVABLE", true},
		{"ERROR_CAPTCHA_UNSOLVABLE\r\n", "ERROR_CAPTCHA_UNSOLVABLE", true},
		{`{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`, "ERROR_CAPTCHA_UNSOLVABLE", true},
		{`{"status":0,"request":"ERROR_TOKEN_EXPIRED","error_text":"expired"}`, "ERROR_TOKEN_EXPIRED", true},
		{"CAPCHA_NOT_READY", "", false},
		{`{"status":0,"request":"CAPCHA_NOT_READY"}`, "", false},
		{"ERROR_NO_SLOT_AVAILABLE", "", false},
		{"ERROR_WRONG_CAPTCHA_ID", "", false},
		{"ERROR_WRONG_USER_KEY", "", false},
		{`{"status":0,"request":"ERROR: 1005"}`, "", false},
		{"OK|ERROR_CAPTCHA_UNSOLVABLE", "", false},
		{"<html>ERROR_CAPTCHA_UNSOLVABLE</html>", "", false},
		{"", "", false},
	}
	for _, tc := range tests {
		code, ok := parseTaskError([]byte(tc.body))
		if ok != tc.ok || (ok && code != tc.code) {
			t.Errorf("parseTaskError(%q) = %q, %v; want %q, %v", tc.body, code, ok, tc.code, tc.ok)
		}
	}
}

func TestAddPingback(t *testing.T) {
	const pb = "https://example.com/cb?a=1&b=2"
	esc := url.QueryEscape(pb)
	const boundary = "XyZ"
	mp := func(parts ...string) string {
		var b strings.Builder
		for i := 0; i+1 < len(parts); i += 2 {
			b.WriteString("--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + parts[i] + "\"\r\n\r\n" + parts[i+1] + "\r\n")
		}
		return b.String()
	}
	file := "--" + boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c.png\"\r\nContent-Type: application/octet-stream\r\n\r\n\x89PNG\r\n--XyZ-\x00\xff\r\n"
	closing := "--" + boundary + "--\r\n"
	mpType := "multipart/form-data; boundary=" + boundary

	tests := []struct {
		name        string
		method      string
		target      string
		contentType string
		body        string
		wantOK      bool
		wantQuery   string // the request's query afterwards
		wantBody    string
	}{
		{
			name: "GET with a query", method: http.MethodGet, target: "/in.php?key=k&method=userrecaptcha",
			wantOK: true, wantQuery: "key=k&method=userrecaptcha&pingback=" + esc,
		},
		{
			name: "GET without a query", method: http.MethodGet, target: "/in.php",
			wantOK: true, wantQuery: "pingback=" + esc,
		},
		{
			name: "urlencoded", method: http.MethodPost, target: "/in.php?json=1", contentType: "application/x-www-form-urlencoded",
			body: "key=k&method=hcaptcha", wantOK: true, wantQuery: "json=1", wantBody: "key=k&method=hcaptcha&pingback=" + esc,
		},
		{
			name: "urlencoded with a trailing &", method: http.MethodPost, target: "/in.php", contentType: "application/x-www-form-urlencoded; charset=utf-8",
			body: "key=k&method=hcaptcha&", wantOK: true, wantBody: "key=k&method=hcaptcha&pingback=" + esc,
		},
		{
			name: "multipart", method: http.MethodPost, target: "/in.php", contentType: mpType,
			body:   mp("key", "k", "method", "post") + file + closing,
			wantOK: true, wantBody: mp("key", "k", "method", "post") + file + mp("pingback", pb) + closing,
		},
		{
			name: "multipart with a quoted boundary", method: http.MethodPost, target: "/in.php", contentType: `multipart/form-data; boundary="XyZ"`,
			body:   mp("key", "k") + closing,
			wantOK: true, wantBody: mp("key", "k") + mp("pingback", pb) + closing,
		},
		{
			name: "multipart without closing boundary", method: http.MethodPost, target: "/in.php", contentType: mpType,
			body: mp("key", "k", "method", "post") + file,
		},
		{
			name: "multipart without boundary", method: http.MethodPost, target: "/in.php", contentType: "multipart/form-data",
			body: mp("key", "k") + closing,
		},
		{
			name: "JSON body", method: http.MethodPost, target: "/in.php", contentType: "application/json",
			body: `{"key":"k"}`,
		},
		{
			name: "no content type", method: http.MethodPost, target: "/in.php",
			body: "key=k",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			query := r.URL.RawQuery
			nb, ok := addPingback(r, []byte(tc.body), pb)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if !ok {
				if r.URL.RawQuery != query {
					t.Errorf("query changed to %q on failure", r.URL.RawQuery)
				}
				return
			}
			if string(nb) != tc.wantBody {
				t.Errorf("body:\n got %q\nwant %q", nb, tc.wantBody)
			}
			if want := tc.wantQuery; r.URL.RawQuery != want {
				t.Errorf("query %q, want %q", r.URL.RawQuery, want)
			}
			if want := r.URL.Path + "?" + r.URL.RawQuery; tc.body == "" && r.RequestURI != want {
				t.Errorf("RequestURI %q, want %q", r.RequestURI, want)
			}
			// The result is a well-formed submission that carries the
			// pingback exactly once.
			setBody(r, nb)
			if got := submitParams(r, nb, 1<<20)["pingback"]; len(got) != 1 || got[0] != pb {
				t.Errorf("parsed pingback %q, want [%q]", got, pb)
			}
		})
	}

	t.Run("does not modify the input body", func(t *testing.T) {
		body := []byte("key=k&&&")
		r := httptest.NewRequest(http.MethodPost, "/in.php", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if _, ok := addPingback(r, body, pb); !ok || string(body) != "key=k&&&" {
			t.Errorf("input body now %q (ok %v), want it unchanged", body, ok)
		}
	})
}

func TestWriteResAnswer(t *testing.T) {
	tests := []struct {
		name     string
		asJSON   bool
		code     string
		wantType string
		want     string
	}{
		{"plain result", false, "03AGdBq25-TOKEN", "text/plain", "OK|03AGdBq25-TOKEN"},
		{"plain result with |", false, "x=1,y=2|x=3,y=4", "text/plain", "OK|x=1,y=2|x=3,y=4"},
		{"plain task error", false, "ERROR_CAPTCHA_UNSOLVABLE", "text/plain", "ERROR_CAPTCHA_UNSOLVABLE"},
		{"JSON result", true, "03AGdBq25-TOKEN", "application/json", `{"status":1,"request":"03AGdBq25-TOKEN"}`},
		{"JSON result with quotes", true, `say "hi"`, "application/json", `{"status":1,"request":"say \"hi\""}`},
		{"JSON task error", true, "ERROR_CAPTCHA_UNSOLVABLE", "application/json", `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			if err := writeResAnswer(w, tc.asJSON, tc.code); err != nil {
				t.Fatal(err)
			}
			if w.Code != http.StatusOK || w.Body.String() != tc.want {
				t.Errorf("got %d %q, want 200 %q", w.Code, w.Body.String(), tc.want)
			}
			if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, tc.wantType) {
				t.Errorf("Content-Type %q, want %s", ct, tc.wantType)
			}
			if tc.asJSON {
				code, ok := parseResultAnswer(w.Body.Bytes())
				if wantOK := !strings.HasPrefix(tc.code, "ERROR"); ok != wantOK || (ok && code != tc.code) {
					t.Errorf("reads back as %q, %v", code, ok)
				}
			}
		})
	}
}

func TestReadUpTo(t *testing.T) {
	const limit = 16
	tests := []struct {
		name    string
		body    string
		hideLen bool // unknown length, as a chunked request
	}{
		{"empty", "", false},
		{"short", "key=k", false},
		{"short, unknown length", "key=k", true},
		{"at the limit", strings.Repeat("a", limit), false},
		{"at the limit, unknown length", strings.Repeat("a", limit), true},
		{"one over", strings.Repeat("b", limit+1), false},
		{"one over, unknown length", strings.Repeat("b", limit+1), true},
		{"far over", strings.Repeat("c", 10*limit), false},
		{"far over, unknown length", strings.Repeat("c", 10*limit), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantWhole := len(tc.body) <= limit
			var rd io.Reader = strings.NewReader(tc.body)
			if tc.hideLen {
				rd = io.MultiReader(rd)
			}
			r := httptest.NewRequest(http.MethodPost, "/in.php", rd)
			if tc.hideLen {
				r.ContentLength = -1
			}
			body, whole, err := readUpTo(r, limit)
			if err != nil {
				t.Fatal(err)
			}
			if whole != wantWhole {
				t.Fatalf("whole = %v, want %v", whole, wantWhole)
			}
			if whole {
				if string(body) != tc.body {
					t.Errorf("body %q, want %q", body, tc.body)
				}
				return
			}
			// Passed through: the request's body still reads whole.
			rest, err := io.ReadAll(r.Body)
			if err != nil || string(rest) != tc.body {
				t.Errorf("request body now reads %q (%v), want all of %q", rest, err, tc.body)
			}
		})
	}

	t.Run("no body", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodGet, "/in.php?key=k", nil)
		if body, whole, err := readUpTo(r, limit); body != nil || !whole || err != nil {
			t.Errorf("got %q, %v, %v; want nil, true, nil", body, whole, err)
		}
	})
	t.Run("read error", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodPost, "/in.php", iotest.ErrReader(io.ErrUnexpectedEOF))
		r.ContentLength = -1
		if _, _, err := readUpTo(r, limit); err == nil {
			t.Error("want an error")
		}
	})
}
