package pingback

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"golang.org/x/crypto/bcrypt"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// consoleHosts are the two sites of the console tests: the console at
// the root of one, under handle_path /console/* on the other (beside the
// pingback route /cb).
var (
	consoleRoot = "http://127.0.0.1:" + testHTTPPort + "/"
	consoleSub  = "http://localhost:" + testHTTPPort + "/console/"
)

// consoleSites mounts the console at the root of 127.0.0.1 and under
// /console/ of localhost, whose /cb is a 2captcha pingback route in front
// of app that stores, for replays, credential headers too (keep_headers),
// so that the tests can check they never reach the page; /cbq is one that
// quarantines pingbacks for unknown ids.
func consoleSites(app *appStub) string {
	return fmt.Sprintf(`http://localhost:%[1]s {
	handle /cb {
		pingback {
			provider 2captcha
			keep_headers Authorization Cookie X-Api-Key Proxy-Authorization X-Auth-Token X-Note X-Evil
		}
		reverse_proxy %[2]s
	}
	handle /cbq {
		pingback {
			provider 2captcha
			unknown_ids quarantine
		}
		reverse_proxy %[2]s
	}
	handle_path /console/* {
		pingback_console
	}
}
http://127.0.0.1:%[1]s {
	pingback_console
}
`, testHTTPPort, app.hostPort())
}

// consoleParkGlobal parks a result after two failed attempts, quickly.
const consoleParkGlobal = "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}"

// postConsolePingback posts a 2captcha pingback to /cb with extra request headers.
func postConsolePingback(t *testing.T, id, code string, header http.Header) {
	t.Helper()
	postConsolePingbackTo(t, "/cb", id, code, header)
}

// postConsolePingbackTo posts a 2captcha pingback to path with extra
// request headers, and wants it answered 200 OK.
func postConsolePingbackTo(t *testing.T, path, id, code string, header http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, testBase+path, strings.NewReader(url.Values{"id": {id}, "code": {code}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("pingback %s: %v", id, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "OK" {
		t.Fatalf("pingback %s: %d %q", id, resp.StatusCode, b)
	}
}

var consoleTokenMeta = regexp.MustCompile(`<meta name="pingback-console-token" content="([^"]+)">`)

// consolePageToken loads the console page at base and returns its token.
func consolePageToken(t *testing.T, base string) string {
	t.Helper()
	status, body := get(t, base)
	m := consoleTokenMeta.FindStringSubmatch(body)
	if status != http.StatusOK || m == nil {
		t.Fatalf("GET %s: %d, no token in %q", base, status, body)
	}
	return m[1]
}

// consoleCall sends method base+"api/"+route with the given headers (a
// JSON body if body is not empty) and returns status, headers and body.
func consoleCall(t *testing.T, method, base, route, body string, header http.Header) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, base+"api/"+route, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, route, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// sameOrigin returns the headers the console page's own fetch sends.
func sameOrigin(base, token string) http.Header {
	u, _ := url.Parse(base)
	return http.Header{"Origin": {u.Scheme + "://" + u.Host}, ConsoleTokenHeader: {token}}
}

// TestConsoleRefusesCrossSite checks the console's defences: every API
// request needs the page's token, and a state-changing one must come from
// the page's own origin; a refused request answers 403 {"error"} and
// changes nothing.
func TestConsoleRefusesCrossSite(t *testing.T) {
	app := newAppStub(t)
	app.setStatus(http.StatusServiceUnavailable)
	startCaddy(t, consoleParkGlobal, consoleSites(app))
	postConsolePingback(t, "7001", "TOKEN-7001", nil)
	waitForState(t, "2captcha", "7001", store.StateParked)
	app.setStatus(http.StatusOK)
	token := consolePageToken(t, consoleRoot)
	expired := func() string {
		defer func(now func() time.Time) { consoleNow = now }(consoleNow)
		consoleNow = func() time.Time { return time.Now().Add(-consoleTokenLife - time.Minute) }
		return newConsoleToken()
	}()
	parts := strings.Split(token, ".")
	forged := parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2]))

	const replay = "records/2captcha/7001/replay"
	for _, tc := range []struct {
		name   string
		method string
		route  string
		header http.Header
	}{
		{"foreign Origin", http.MethodPost, replay, http.Header{"Origin": {"http://evil.example"}, ConsoleTokenHeader: {token}}},
		{"Origin of another port", http.MethodPost, replay, http.Header{"Origin": {"http://127.0.0.1:1"}, ConsoleTokenHeader: {token}}},
		{"null Origin", http.MethodPost, replay, http.Header{"Origin": {"null"}, ConsoleTokenHeader: {token}}},
		{"no token", http.MethodPost, replay, http.Header{"Origin": {"http://127.0.0.1:" + testHTTPPort}}},
		{"forged token", http.MethodPost, replay, http.Header{"Origin": {"http://127.0.0.1:" + testHTTPPort}, ConsoleTokenHeader: {forged}}},
		{"expired token", http.MethodPost, replay, http.Header{"Origin": {"http://127.0.0.1:" + testHTTPPort}, ConsoleTokenHeader: {expired}}},
		{"no Origin, no Sec-Fetch-Site", http.MethodPost, replay, http.Header{ConsoleTokenHeader: {token}}},
		{"no Origin, cross-site fetch", http.MethodPost, replay, http.Header{ConsoleTokenHeader: {token}, "Sec-Fetch-Site": {"cross-site"}}},
		{"no-cors mode", http.MethodPost, replay, http.Header{"Origin": {"http://127.0.0.1:" + testHTTPPort}, ConsoleTokenHeader: {token}, "Sec-Fetch-Mode": {"no-cors"}}},
		{"bulk replay from a foreign Origin", http.MethodPost, "replays", http.Header{"Origin": {"http://evil.example"}, ConsoleTokenHeader: {token}}},
		{"release from a foreign Origin", http.MethodPost, "records/2captcha/7001/release", http.Header{"Origin": {"http://evil.example"}, ConsoleTokenHeader: {token}}},
		{"release without the token", http.MethodPost, "records/2captcha/7001/release", http.Header{"Origin": {"http://127.0.0.1:" + testHTTPPort}}},
		{"read without token", http.MethodGet, "records?state=parked", nil},
		{"read from a foreign Origin", http.MethodGet, "records?state=parked", http.Header{"Origin": {"http://evil.example"}, ConsoleTokenHeader: {token}}},
	} {
		status, _, body := consoleCall(t, tc.method, consoleRoot, tc.route, "", tc.header)
		var e struct{ Error string }
		if status != http.StatusForbidden || json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
			t.Errorf("%s: %d %s, want 403 with an error", tc.name, status, body)
		}
	}
	if n := app.count("2captcha:7001"); n != 2 {
		t.Fatalf("the app saw 2captcha:7001 %d times, want 2 (no refused replay reached it)", n)
	}
	if rec := getRecord(t, "2captcha", "7001"); rec.State != store.StateParked || rec.Attempts != 2 {
		t.Fatalf("after the refused requests: %s after %d attempts, want parked after 2", rec.State, rec.Attempts)
	}

	// The page's own requests pass: with Origin, and without it when the
	// browser says same-origin (GET needs no Origin).
	if status, _, body := consoleCall(t, http.MethodGet, consoleRoot, "records?state=parked", "", http.Header{ConsoleTokenHeader: {token}}); status != http.StatusOK {
		t.Errorf("GET with the token: %d %s", status, body)
	}
	status, _, body := consoleCall(t, http.MethodPost, consoleRoot, replay, "", http.Header{ConsoleTokenHeader: {token}, "Sec-Fetch-Site": {"same-origin"}})
	if status != http.StatusOK || !strings.Contains(body, `"state":"delivered"`) {
		t.Fatalf("same-origin replay: %d %s, want 200 and delivered", status, body)
	}
	// A token of the page under /console/ is valid for the root site too
	// (one secret per process), but the Origin must be the request's host.
	sub := consolePageToken(t, consoleSub)
	if status, _, body := consoleCall(t, http.MethodPost, consoleSub, replay+"?force=true", "", sameOrigin(consoleRoot, sub)); status != http.StatusForbidden {
		t.Errorf("Origin 127.0.0.1 on the localhost site: %d %s, want 403", status, body)
	}
}

// TestConsoleAPIIsTheAdminAPI checks that <mount>/api/<route> answers
// what the admin API's /pingback/<route> answers, at a site's root and
// under handle_path, that credential headers never reach the page, and
// the page, its assets and its errors.
func TestConsoleAPIIsTheAdminAPI(t *testing.T) {
	app := newAppStub(t)
	app.setStatus(http.StatusServiceUnavailable)
	startCaddy(t, consoleParkGlobal, consoleSites(app))
	secrets := http.Header{
		"Authorization":       {"Bearer SECRET-AUTHORIZATION"},
		"Cookie":              {"session=SECRET-COOKIE"},
		"X-Api-Key":           {"SECRET-API-KEY"},
		"Proxy-Authorization": {"Basic SECRET-PROXY"},
		"X-Auth-Token":        {"SECRET-AUTH-TOKEN"},
		"X-Note":              {"<b>shown</b>"},
	}
	postConsolePingback(t, "7101", "TOKEN-7101", secrets)
	postConsolePingback(t, "7102", "TOKEN-7102", nil)
	waitForState(t, "2captcha", "7101", store.StateParked)
	waitForState(t, "2captcha", "7102", store.StateParked)

	for _, base := range []string{consoleRoot, consoleSub} {
		token := consolePageToken(t, base)
		hdr := sameOrigin(base, token)
		for _, route := range []string{
			"status", "records?state=parked", "records?state=parked&limit=1", "records?provider=2captcha",
			"records/2captcha/7102", "records/2captcha/404", "records?state=lost", "records?limit=0",
			"tasks?state=pending", "tasks/2captcha/7102", "nothing/here", "records/2captcha/7102/replay",
			"records/2captcha/7102%2Freplay", // one id, "7102/replay": GET of one record, 404
		} {
			status, _, body := consoleCall(t, http.MethodGet, base, route, "", hdr)
			wantStatus, wantBody := adminRequest(t, http.MethodGet, "/pingback/"+route)
			if route == "nothing/here" {
				wantStatus = http.StatusNotFound // not an admin route either
			}
			if route == "status" {
				// Loop times and free space move between the two calls:
				// compare the rest.
				var got, want map[string]any
				if json.Unmarshal([]byte(body), &got) != nil || json.Unmarshal(wantBody, &want) != nil {
					t.Fatalf("%s status: %s / %s", base, body, wantBody)
				}
				for _, m := range []map[string]any{got, want} {
					delete(m, "loops")
					if st, ok := m["store"].(map[string]any); ok {
						delete(st, "free_bytes")
					}
				}
				body, wantBody = fmt.Sprint(got), []byte(fmt.Sprint(want))
			}
			if status != wantStatus || (status < 300 && body != string(wantBody)) {
				t.Errorf("%s api/%s: %d %s, want the admin API's %d %s", base, route, status, body, wantStatus, wantBody)
			}
			if status >= 400 && !strings.Contains(body, `"error"`) {
				t.Errorf("%s api/%s: %d %s, want {\"error\"}", base, route, status, body)
			}
		}
		for _, route := range []string{"records?state=parked", "records/2captcha/7101"} {
			status, _, body := consoleCall(t, http.MethodGet, base, route, "", hdr)
			if status != http.StatusOK || strings.Contains(body, "SECRET-") || strings.Count(body, redactedValue) != 5 ||
				!strings.Contains(body, `\u003cb\u003eshown\u003c/b\u003e`) {
				t.Errorf("%s api/%s: %d %s, want the 5 credential headers redacted and X-Note kept", base, route, status, body)
			}
		}
		if rec := getRecord(t, "2captcha", "7101"); rec.Request.Header.Get("X-Api-Key") != "SECRET-API-KEY" {
			t.Fatalf("stored headers %v: without X-Api-Key kept, the redaction check above proves nothing", rec.Request.Header)
		}

		// A bulk replay through the console: its Location is under the mount.
		status, h, body := consoleCall(t, http.MethodPost, base, "replays", `{"provider": "2captcha", "state": "rejected"}`, hdr)
		var job adminapi.ReplayJobState
		u, _ := url.Parse(base)
		if status != http.StatusAccepted || json.Unmarshal([]byte(body), &job) != nil || h.Get("Location") != u.Path+"api/replays/"+job.ID {
			t.Errorf("%s POST api/replays: %d %q %s, want 202 with Location %sapi/replays/<id>", base, status, h.Get("Location"), body, u.Path)
		}
		if status, _, body := consoleCall(t, http.MethodGet, base, "replays/"+job.ID, "", hdr); status != http.StatusOK || !strings.Contains(body, job.ID) {
			t.Errorf("%s GET api/replays/%s: %d %s", base, job.ID, status, body)
		}
		for _, tc := range []struct {
			method, route, body string
			status              int
		}{
			{http.MethodPost, "replays", `{"state": "delivered"}`, http.StatusBadRequest},
			{http.MethodPost, "replays", `{"nonsense": 1}`, http.StatusBadRequest},
			{http.MethodPost, "records/2captcha/404/replay", "", http.StatusNotFound},
			{http.MethodDelete, "replays/nope", "", http.StatusNotFound},
			{http.MethodPost, "status", "", http.StatusMethodNotAllowed},
		} {
			status, _, body := consoleCall(t, tc.method, base, tc.route, tc.body, hdr)
			if status != tc.status || !strings.Contains(body, `"error"`) {
				t.Errorf("%s %s api/%s: %d %s, want %d with an error", base, tc.method, tc.route, status, body, tc.status)
			}
		}
	}
	if n := app.count("2captcha:7101"); n != 2 {
		t.Errorf("the app saw 2captcha:7101 %d times, want 2: nothing above replays it", n)
	}

	// The page and its assets.
	for _, tc := range []struct {
		method, url string
		status      int
		ctype, has  string
	}{
		{http.MethodGet, consoleRoot, http.StatusOK, "text/html", `<script src="console.js"`},
		{http.MethodGet, consoleSub, http.StatusOK, "text/html", `<meta name="pingback-states" content="queued forwarding delivered failed rejected parked`},
		{http.MethodGet, consoleSub + "console.js", http.StatusOK, "text/javascript", "X-Pingback-Console-Token"},
		{http.MethodGet, consoleRoot + "console.css", http.StatusOK, "text/css", "box-sizing"},
		{http.MethodGet, consoleSub + "index.html", http.StatusNotFound, "", ""},
		{http.MethodPost, consoleRoot, http.StatusMethodNotAllowed, "", ""},
	} {
		req, _ := http.NewRequest(tc.method, tc.url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(string(b), tc.has) {
			t.Errorf("%s %s: %d %q, want %d %s containing %q", tc.method, tc.url, resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, tc.ctype, tc.has)
		}
		if tc.status == http.StatusOK && !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("%s: CSP %q", tc.url, resp.Header.Get("Content-Security-Policy"))
		}
	}
	// Each load has its own token.
	if a, b := consolePageToken(t, consoleRoot), consolePageToken(t, consoleRoot); a == b {
		t.Errorf("two page loads share the token %s", a)
	}
}

// TestConsoleMountRedirect checks that the mount point without its slash
// redirects to it, so that the page's relative URLs resolve under it.
func TestConsoleMountRedirect(t *testing.T) {
	startCaddy(t, "", fmt.Sprintf("http://localhost:%s {\n\thandle_path /ops* {\n\t\tpingback_console\n\t}\n}\n", testHTTPPort))
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(testBase + "/ops?state=parked")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ops/?state=parked" {
		t.Fatalf("GET /ops: %d %q, want 301 to /ops/?state=parked", resp.StatusCode, resp.Header.Get("Location"))
	}
	consolePageToken(t, testBase+"/ops/")
}

// TestConsoleBehindBasicAuth checks the README's set-up: basic_auth in
// front of the console guards the page and its API.
func TestConsoleBehindBasicAuth(t *testing.T) {
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost) // as caddy hash-password makes it
	if err != nil {
		t.Fatal(err)
	}
	startCaddy(t, "", fmt.Sprintf("http://localhost:%s {\n\tbasic_auth {\n\t\tops %s\n\t}\n\tpingback_console\n}\n", testHTTPPort, hash))
	if status, _ := get(t, testBase+"/"); status != http.StatusUnauthorized {
		t.Fatalf("GET / without credentials: %d, want 401", status)
	}
	req, _ := http.NewRequest(http.MethodGet, testBase+"/", nil)
	req.SetBasicAuth("ops", "s3cret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := consoleTokenMeta.FindSubmatch(b)
	if resp.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("GET / with credentials: %d %s", resp.StatusCode, b)
	}
	if status, _, _ := consoleCall(t, http.MethodGet, testBase+"/", "status", "", http.Header{ConsoleTokenHeader: {string(m[1])}}); status != http.StatusUnauthorized {
		t.Errorf("api/status with the token but no credentials: %d, want 401", status)
	}
}

// TestConsoleDirective checks the directive's syntax.
func TestConsoleDirective(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"pingback_console", true},
		{"pingback_console extra", false},
		{"pingback_console {\n\tmount /x\n}", false},
	} {
		err := new(Console).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("%q: error %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
}
