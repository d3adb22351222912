package protocol

import (
	"bytes"
	"net/url"
	"strings"
	"testing"
)

const tok = "0123456789abcdef0123456789abcdef"

func TestNewToken(t *testing.T) {
	a, b := NewToken(), NewToken()
	if !ValidToken(a) || !ValidToken(b) || a == b {
		t.Errorf("NewToken gave %q and %q; want two different valid tokens", a, b)
	}
	for _, bad := range []string{"", tok[:31], tok + "0", strings.ToUpper(tok), "g" + tok[1:]} {
		if ValidToken(bad) {
			t.Errorf("ValidToken(%q) = true", bad)
		}
	}
}

func TestAddAndStripToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://a.example/pb", "https://a.example/pb?pingback_token=" + tok},
		{"https://a.example/pb?x=1", "https://a.example/pb?x=1&pingback_token=" + tok},
		{"https://a.example/pb?", "https://a.example/pb?pingback_token=" + tok},
		{"https://a.example/pb?x=1&", "https://a.example/pb?x=1&pingback_token=" + tok},
		{"https://a.example/pb#f", ""},
		{"https://a.example/pb?pingback_token=1", ""},
	} {
		got, ok := AddToken(tc.in, tok)
		if got != tc.want || ok != (tc.want != "") {
			t.Errorf("AddToken(%q) = %q, %v; want %q", tc.in, got, ok, tc.want)
			continue
		}
		if !ok {
			continue
		}
		u, _ := url.Parse(got)
		if v, n := QueryToken(u.RawQuery); v != tok || n != 1 {
			t.Errorf("QueryToken(%q) = %q, %d", u.RawQuery, v, n)
		}
		orig, _ := url.Parse(strings.TrimSuffix(tc.in, "?"))
		if back := StripTokenURI(u.RequestURI()); back != strings.TrimSuffix(strings.TrimSuffix(orig.RequestURI(), "&"), "?") && back != orig.RequestURI() {
			t.Errorf("StripTokenURI(%q) = %q, want %q", u.RequestURI(), back, orig.RequestURI())
		}
	}
	// CaptchaAI appends id and code after the token.
	if got := StripTokenURI("/pb?pingback_token=" + tok + "&id=1&code=x;y"); got != "/pb?id=1&code=x;y" {
		t.Errorf("StripTokenURI of a CaptchaAI pingback = %q", got)
	}
	if got := StripTokenURI("/pb?a=1&pingback_token=x&pingback_token=y&b=2"); got != "/pb?a=1&b=2" {
		t.Errorf("StripTokenURI with two tokens = %q", got)
	}
}

func TestTokenPingback(t *testing.T) {
	esc := url.QueryEscape
	for _, tc := range []struct {
		name, query, ct, body string
		wantQuery, wantBody   string
		wantPB                string
		ok                    bool
	}{
		{"GET, URL without query", "key=k&method=post&pingback=" + esc("https://a/pb") + "&json=1", "", "",
			"key=k&method=post&pingback=" + esc("https://a/pb") + esc("?pingback_token="+tok) + "&json=1", "", "https://a/pb", true},
		{"GET, URL unescaped", "key=k&pingback=https://a/pb", "", "",
			"key=k&pingback=https://a/pb" + esc("?pingback_token="+tok), "", "https://a/pb", true},
		{"GET, URL with a query: no token", "key=k&pingback=" + esc("https://a/pb?x=1"), "", "", "", "", "", false},
		{"no pingback", "key=k", "", "", "", "", "", false},
		{"repeated", "pingback=a&pingback=b", "", "", "", "", "", false},
		{"urlencoded POST keeps the URL's query", "", "application/x-www-form-urlencoded", "key=k&pingback=" + esc("https://a/pb?x=1&y=2"),
			"", "key=k&pingback=" + esc("https://a/pb?x=1&y=2") + esc("&pingback_token="+tok), "https://a/pb?x=1&y=2", true},
		{"multipart", "", "multipart/form-data; boundary=XX",
			"--XX\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nk\r\n--XX\r\nContent-Disposition: form-data; name=\"pingback\"\r\n\r\nhttps://a/pb?x=1\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"pingback\"\r\n\r\n\x00\x01\r\n--XX--\r\n",
			"", "--XX\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nk\r\n--XX\r\nContent-Disposition: form-data; name=\"pingback\"\r\n\r\nhttps://a/pb?x=1&pingback_token=" + tok + "\r\n--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"pingback\"\r\n\r\n\x00\x01\r\n--XX--\r\n",
			"https://a/pb?x=1", true},
	} {
		q, b, pb, ok := TokenPingback(tc.query, tc.ct, []byte(tc.body), tok)
		if ok != tc.ok {
			t.Errorf("%s: ok = %v", tc.name, ok)
			continue
		}
		if !ok {
			if q != tc.query || string(b) != tc.body {
				t.Errorf("%s: refused but changed the submission", tc.name)
			}
			continue
		}
		if tc.wantQuery == "" {
			tc.wantQuery = tc.query
		}
		if tc.wantBody == "" {
			tc.wantBody = tc.body
		}
		if q != tc.wantQuery || string(b) != tc.wantBody || pb != tc.wantPB {
			t.Errorf("%s:\n got %q %q %q\nwant %q %q %q", tc.name, q, b, pb, tc.wantQuery, tc.wantBody, tc.wantPB)
		}
	}
}

func TestTokenCallbackURL(t *testing.T) {
	body := `{"clientKey":"k","task":{"type":"T","callbackUrl":"x"},"callbackUrl":"https:\/\/a\/pb?x=1" ,"z":1}`
	got, cb, ok := TokenCallbackURL([]byte(body), tok)
	want := `{"clientKey":"k","task":{"type":"T","callbackUrl":"x"},"callbackUrl":"https://a/pb?x=1&pingback_token=` + tok + `" ,"z":1}`
	if !ok || string(got) != want || cb != "https://a/pb?x=1" {
		t.Errorf("TokenCallbackURL = %q, %q, %v\nwant %q", got, cb, ok, want)
	}
	for _, bad := range []string{`{"callbackUrl":null}`, `{"callbackUrl":""}`, `{"callbackUrl":"a","callbackUrl":"b"}`, `{"x":1}`, `[1]`} {
		if _, _, ok := TokenCallbackURL([]byte(bad), tok); ok {
			t.Errorf("TokenCallbackURL(%s) accepted", bad)
		}
	}
}

func TestCanonicalID(t *testing.T) {
	two, _ := Lookup("2captcha")
	cs, _ := Lookup("capsolver")
	for _, tc := range []struct {
		p        Provider
		in, want string
	}{{two, "0123", "123"}, {two, "123", "123"}, {two, "000", "0"}, {two, "0", "0"},
		{cs, "61138BB6-19fb-11EC", "61138bb6-19fb-11ec"}} {
		if got := tc.p.CanonicalID(tc.in); got != tc.want {
			t.Errorf("%s CanonicalID(%q) = %q, want %q", tc.p.Name, tc.in, got, tc.want)
		}
	}
}

// The token parsers never panic; what they add is exactly the token, and
// stripping it gives the input back.
func FuzzTokenQuery(f *testing.F) {
	for _, s := range []string{"", "a=1", "pingback_token=" + tok, "pingback_token=" + tok + "&id=1&code=x", "a&&pingback_token&=", "%70ingback_token=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		v, n := QueryToken(q)
		stripped := StripToken(q)
		if n == 0 && stripped != q {
			t.Fatalf("StripToken(%q) = %q with no token in it", q, stripped)
		}
		if _, m := QueryToken(stripped); m != 0 {
			t.Fatalf("StripToken(%q) = %q still holds a token", q, stripped)
		}
		if n > 0 && !strings.Contains(q, TokenParam+"="+v) && !strings.HasSuffix(q, TokenParam) && !strings.Contains(q, TokenParam+"&") {
			t.Fatalf("QueryToken(%q) = %q, not in the query", q, v)
		}
		if strings.Contains(q, "#") {
			return
		}
		u := "https://a.example/pb"
		if q != "" {
			u += "?" + q
		}
		added, ok := AddToken(u, tok)
		if !ok {
			if n == 0 {
				t.Fatalf("AddToken(%q) refused a URL without a token", u)
			}
			return
		}
		if !strings.HasPrefix(added, u) {
			t.Fatalf("AddToken(%q) = %q changed the URL", u, added)
		}
		_, rq, _ := strings.Cut(added, "?")
		if v, n := QueryToken(rq); v != tok || n != 1 {
			t.Fatalf("AddToken(%q) = %q: QueryToken gives %q, %d", u, added, v, n)
		}
	})
}

// TokenPingback and TokenCallbackURL change nothing but the pingback
// value, which they only extend.
func FuzzTokenSubmission(f *testing.F) {
	f.Add("key=k&pingback=https://a/pb", "", []byte(nil))
	f.Add("", "application/x-www-form-urlencoded", []byte("pingback=https%3A%2F%2Fa%2Fpb%3Fx%3D1&json=1"))
	f.Add("", "multipart/form-data; boundary=B", []byte("--B\r\nContent-Disposition: form-data; name=\"pingback\"\r\n\r\nhttps://a/pb\r\n--B--\r\n"))
	f.Add("", "application/json", []byte(`{"callbackUrl":"https://a/pb","task":{}}`))
	f.Fuzz(func(t *testing.T, query, ct string, body []byte) {
		q, nb, pb, ok := TokenPingback(query, ct, body, tok)
		if !ok {
			if q != query || !bytes.Equal(nb, body) {
				t.Fatal("refused but changed the submission")
			}
		} else {
			grew := len(q) - len(query) + len(nb) - len(body)
			if grew <= 0 || pb == "" {
				t.Fatalf("added nothing: %q %q %q", q, nb, pb)
			}
			if q != query && !bytes.Equal(nb, body) {
				t.Fatal("changed both query and body")
			}
		}
		if out, cb, ok := TokenCallbackURL(body, tok); ok {
			if cb == "" || len(out) <= len(body)-len(cb)-2 {
				t.Fatalf("TokenCallbackURL(%q) = %q, %q", body, out, cb)
			}
			if _, _, again := TokenCallbackURL(out, tok); again {
				t.Fatalf("a tokened callbackUrl took a second token: %q", out)
			}
		}
	})
}

// CanonicalID keeps valid ids valid, is idempotent, and maps the
// leading-zero and upper-case spellings of one id to one key.
func FuzzCanonicalID(f *testing.F) {
	for _, s := range []string{"0", "0123", "123", "61138BB6-19fb", "", "00000000000000000000000000000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		for _, name := range Names() {
			p, _ := Lookup(name)
			if !p.ValidID(id) {
				continue
			}
			c := p.CanonicalID(id)
			if !p.ValidID(c) || p.CanonicalID(c) != c {
				t.Fatalf("%s: CanonicalID(%q) = %q: invalid or not idempotent", name, id, c)
			}
			if p.UUIDTaskID {
				if c != strings.ToLower(id) {
					t.Fatalf("%s: CanonicalID(%q) = %q", name, id, c)
				}
			} else if z := "0" + id; p.ValidID(z) && p.CanonicalID(z) != c {
				t.Fatalf("%s: %q and %q have different keys", name, id, z)
			}
		}
	})
}

func TestRedactTokenURI(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/cb", "/cb"},
		{"/cb?a=1", "/cb?a=1"},
		{"/cb?pingback_token=abc", "/cb?pingback_token=X"},
		{"/cb?a=1&pingback_token=abc&b=2", "/cb?a=1&pingback_token=X&b=2"},
		{"/cb?pingback_token=a&pingback_token=b", "/cb?pingback_token=X&pingback_token=X"},
		{"/cb?pingback_token", "/cb?pingback_token=X"},
		{"/cb?my_pingback_token=abc", "/cb?my_pingback_token=abc"},
		{"/pingback_token?x=pingback_token", "/pingback_token?x=pingback_token"},
	} {
		if got := RedactTokenURI(tc.in, "X"); got != tc.want {
			t.Errorf("RedactTokenURI(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
