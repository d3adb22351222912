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
