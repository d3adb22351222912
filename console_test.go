package pingback

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"

	"github.com/caddy-pingback/pingback/internal/admin"
	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
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
func consoleSites(app *testkit.App) string {
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
`, testHTTPPort, app.HostPort())
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
	status, body := testkit.Get(t, base)
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
	app.SetStatus(http.StatusServiceUnavailable)
	startCaddy(t, consoleParkGlobal, consoleSites(app))
	postConsolePingback(t, "7001", "TOKEN-7001", nil)
	waitForState(t, 5*time.Second, "2captcha", "7001", store.StateParked)
	app.SetStatus(http.StatusOK)
	token := consolePageToken(t, consoleRoot)
	// A token issued before its life: the secret is the process's, so a
	// console with an earlier clock signs what the running one checks.
	expired := admin.NewConsole(nil, nil, admin.ConsoleOptions{
		Now: func() time.Time { return time.Now().Add(-admin.ConsoleTokenLife - time.Minute) },
	}).NewToken()
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
	if n := app.Count("2captcha:7001"); n != 2 {
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
	app.SetStatus(http.StatusServiceUnavailable)
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
	waitForState(t, 5*time.Second, "2captcha", "7101", store.StateParked)
	waitForState(t, 5*time.Second, "2captcha", "7102", store.StateParked)

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
			wantStatus, wantBody := adminDo(t, http.MethodGet, "/pingback/"+route, "")
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
	if n := app.Count("2captcha:7101"); n != 2 {
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
	if status, _ := testkit.Get(t, testBase+"/"); status != http.StatusUnauthorized {
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

// browserPath finds Chromium, or skips (fails under
// PINGBACK_REQUIRE_BROWSER).
func browserPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("PINGBACK_REQUIRE_BROWSER") != "" {
		t.Fatal("PINGBACK_REQUIRE_BROWSER is set and no chromium is installed (apt-get install chromium)")
	}
	t.Skip("no chromium installed (apt-get install chromium); set PINGBACK_REQUIRE_BROWSER=1 to fail instead")
	return ""
}

// browserTab is a tab of a fresh headless Chromium (its own profile), and
// the uncaught JavaScript exceptions of its pages.
type browserTab struct {
	ctx context.Context

	mu         sync.Mutex
	exceptions []string
}

func newBrowserTab(t *testing.T) *browserTab {
	t.Helper()
	path := browserPath(t)
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // root in CI
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1100, 800),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	b := &browserTab{ctx: ctx}
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			b.mu.Lock()
			defer b.mu.Unlock()
			desc := e.ExceptionDetails.Text
			if e.ExceptionDetails.Exception != nil {
				desc += " " + e.ExceptionDetails.Exception.Description
			}
			b.exceptions = append(b.exceptions, desc)
		}
	}); err != nil {
		t.Fatalf("starting chromium %s: %v", path, err)
	}
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, e := range b.exceptions {
			t.Errorf("uncaught JavaScript exception: %s", e)
		}
	})
	return b
}

// do runs steps with a timeout.
func (b *browserTab) do(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression.
func evalJS[T any](t *testing.T, b *browserTab, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// until waits for a JavaScript expression to be truthy. Right after a
// navigation, the tab may still name the old document's JavaScript context,
// which the browser has just destroyed: the poll is then started again in
// the new one.
func until(expr string) chromedp.Action[chromedp.Void] {
	poll := chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))
	return func(ctx context.Context, tgt *chromedp.Target) (chromedp.Void, error) {
		for {
			v, err := poll(ctx, tgt)
			if err == nil || !(strings.Contains(err.Error(), "Cannot find context with specified id") ||
				strings.Contains(err.Error(), "Execution context was destroyed")) || ctx.Err() != nil {
				return v, err
			}
			select { // pace the retries
			case <-ctx.Done():
				return v, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// screenshot saves a full-page PNG screenshot as name in the screenshot
// directory.
func (b *browserTab) screenshot(t *testing.T, name string) {
	t.Helper()
	dir := os.Getenv("PINGBACK_CONSOLE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "pingback-console-screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	img, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", p, len(img))
}

// noHorizontalScroll checks that the page fits a 390 px wide phone.
func noHorizontalScroll(t *testing.T, b *browserTab, page string) {
	t.Helper()
	if w := evalJS[int](t, b, `document.documentElement.scrollWidth`); w > 390 {
		t.Errorf("%s: the page is %d px wide at a 390 px viewport: it scrolls sideways", page, w)
	}
}

const consoleXSS = `<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>`

// TestConsoleBrowser drives the console in Chromium, mounted at a site's
// root and under handle_path: the overview and the dead-letter queue show
// parked results; Replay delivers one and the page shows it delivered;
// the record's detail renders attacker-supplied data as text and hides
// credential headers; bulk replay shows its progress to the end; purge
// appears only where the admin API has it; the provider's account shows
// with its api_key entry (never the key) and labels its tasks, which
// filter by it; every view fits 390×844.
//
// The console's browser test drives a real headless Chromium (Debian's
// chromium package; .ci/run installs it) with chromedp. It is skipped only
// when no Chromium is installed and PINGBACK_REQUIRE_BROWSER is unset; CI
// sets it, so the test can never be skipped there.
//
// Screenshots go to $PINGBACK_CONSOLE_SCREENSHOTS, default
// <os.TempDir()>/pingback-console-screenshots (never the repository):
// overview.png, record.png, quarantined.png (a release being confirmed),
// record-phone.png; docs/console.png is a copy of overview.png from a run.
func TestConsoleBrowser(t *testing.T) {
	b := newBrowserTab(t)
	app := newAppStub(t)
	app.SetStatus(http.StatusServiceUnavailable)
	startCaddy(t, trkGlobal+"\n"+consoleParkGlobal, consoleSites(app))

	postConsolePingback(t, "7500", consoleXSS, http.Header{
		"Authorization": {"Bearer SECRET-AUTHORIZATION"},
		"Cookie":        {"session=SECRET-COOKIE"},
		"X-Api-Key":     {"SECRET-API-KEY"},
		"X-Evil":        {consoleXSS},
	})
	const bulk = 5
	for i := range bulk {
		postConsolePingback(t, strconv.Itoa(7501+i), "TOKEN-"+strconv.Itoa(7501+i), nil)
	}
	// A pingback for an id no task has, on the route that quarantines them.
	const quarantinedCode = "<b>QUARANTINED-7700</b>"
	postConsolePingbackTo(t, "/cbq", "7700", quarantinedCode, nil)
	for i := range bulk + 1 {
		waitForState(t, 5*time.Second, "2captcha", strconv.Itoa(7500+i), store.StateParked)
	}
	waitForState(t, 5*time.Second, "2captcha", "7700", store.StateQuarantined)
	if status, body := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{
		"provider": "2captcha", "id": "7600", "pingback_url": trkCallbackURL,
	})); status != http.StatusCreated {
		t.Fatalf("registering a task: %d %s", status, body)
	}

	// At the root of 127.0.0.1: the overview counts the parked and the
	// quarantined results.
	b.do(t, "overview", chromedp.Navigate(consoleRoot),
		until(`(document.querySelector('[data-provider="2captcha"]')||{}).innerText?.includes('parked 6')`),
		until(`document.querySelector('[data-provider="2captcha"]').innerText.includes('quarantined 1')`))
	b.screenshot(t, "overview.png")
	// The provider's one account, named by its api_key entry, with the
	// registered task pending; the key itself nowhere.
	acct := accountID("2captcha", trkKey)
	acctSel := `[data-provider="2captcha"] [data-account="` + acct + `"]`
	b.do(t, "overview's account", until(`document.querySelector('`+acctSel+`')`))
	if text := evalJS[string](t, b, `document.querySelector('`+acctSel+`').innerText`); !strings.Contains(text, acct) ||
		!strings.Contains(text, "api_key #1") || !strings.Contains(text, "pending\n1") {
		t.Errorf("the account reads %q, want its id, api_key #1 and 1 pending task", text)
	}
	if text := evalJS[string](t, b, `document.body.innerText`); strings.Contains(text, trkKey) {
		t.Error("the overview shows the API key")
	}

	// The dead-letter queue, by a linkable filter.
	b.do(t, "dead letters", chromedp.Navigate(consoleRoot+"?state=parked"),
		until(`document.querySelectorAll('#records [data-key]').length === 6`))
	app.SetStatus(http.StatusOK)
	b.do(t, "replay one", chromedp.Click(chromedp.CSS(`[data-key="2captcha:7500"] [data-action="replay"]`)),
		until(`document.querySelector('[data-key="2captcha:7500"] .state').textContent === 'delivered'`))
	if rec := getRecord(t, "2captcha", "7500"); rec.State != store.StateDelivered || app.Deliveries("2captcha:7500") != 1 {
		t.Fatalf("after Replay: %s, %d deliveries; want delivered once", rec.State, app.Deliveries("2captcha:7500"))
	}
	// Replay of a delivered result: refused (409), "Replay anyway" offered.
	b.do(t, "replay a delivered one", chromedp.Click(chromedp.CSS(`[data-key="2captcha:7500"] [data-action="replay"]`)),
		until(`document.querySelector('[data-key="2captcha:7500"] [data-action="force-replay"]')`))
	if n := app.Count("2captcha:7500"); n != 3 {
		t.Errorf("the app saw 2captcha:7500 %d times, want 3 (2 failed, 1 replay; the refused one not sent)", n)
	}

	// The record's detail: attacker-supplied data is text, credentials hidden.
	b.do(t, "detail", chromedp.Click(chromedp.CSS(`[data-key="2captcha:7500"] a`)),
		until(`document.querySelector('#record #code')`))
	if got := evalJS[string](t, b, `document.querySelector('#code').textContent`); got != consoleXSS {
		t.Errorf("the result's code renders as %q, want the text %q", got, consoleXSS)
	}
	if n := evalJS[int](t, b, `document.querySelectorAll('main img, main script').length`); n != 0 {
		t.Errorf("the page has %d img or script elements from the record's data", n)
	}
	if v := evalJS[bool](t, b, `window.__xss !== undefined`); v {
		t.Error("the record's data ran as script")
	}
	text := evalJS[string](t, b, `document.body.innerText`)
	if strings.Contains(text, "SECRET-") || !strings.Contains(text, redactedValue) || !strings.Contains(text, consoleXSS) {
		t.Errorf("detail text %q: want credentials hidden and X-Evil shown as text", text)
	}
	if strings.Contains(text, "[object") || strings.Contains(text, "undefined") {
		t.Errorf("detail text %q: a value rendered as [object ...] or undefined", text)
	}
	// The attempt history, where the admin API answers it.
	if _, body := adminDo(t, http.MethodGet, "/pingback/records/2captcha/7500", ""); strings.Contains(string(body), `"history":[`) {
		if rows := evalJS[int](t, b, `document.querySelectorAll('#history tbody tr').length`); rows != 3 {
			t.Errorf("history shows %d attempts, want 3 (callback, replay, manual)", rows)
		}
		if got := evalJS[string](t, b, `document.querySelector('#history tbody tr:last-child').innerText`); !strings.Contains(got, "manual") || !strings.Contains(got, "delivered") {
			t.Errorf("the last attempt reads %q, want a manual replay, delivered", got)
		}
	} else {
		t.Log("the admin API answers no history: none shown")
	}
	b.screenshot(t, "record.png")

	// The quarantine: listed with its reason and a Release button (no
	// Replay, no bulk replay); released from its detail after a
	// confirmation, it reaches the app once, as a release, and the page
	// shows it delivered.
	b.do(t, "quarantine", chromedp.Navigate(consoleRoot+"?state=quarantined"),
		until(`document.querySelectorAll('#records [data-key]').length === 1`),
		until(`document.querySelector('[data-key="2captcha:7700"]').innerText.includes('unknown_id')`))
	if n := evalJS[int](t, b, `document.querySelectorAll('[data-key="2captcha:7700"] [data-action="release"]').length`); n != 1 {
		t.Errorf("the quarantined result has %d Release buttons, want 1", n)
	}
	if n := evalJS[int](t, b, `document.querySelectorAll('[data-key="2captcha:7700"] [data-action="replay"], #bulk-replay').length`); n != 0 {
		t.Errorf("the quarantine offers %d replay buttons, want none (replay refuses quarantined results)", n)
	}
	b.do(t, "quarantined detail", chromedp.Click(chromedp.CSS(`[data-key="2captcha:7700"] a`)),
		until(`document.querySelector('#record [data-action="release"]')`))
	qrec := getRecord(t, "2captcha", "7700")
	text = evalJS[string](t, b, `document.querySelector('#record').innerText`)
	for _, want := range []string{"quarantine", qrec.Quarantine, qrec.Verified} {
		if !strings.Contains(text, want) {
			t.Errorf("quarantined detail %q does not show %q", text, want)
		}
	}
	if qrec.Quarantine != "unknown_id" {
		t.Errorf("7700 quarantined as %q, want unknown_id", qrec.Quarantine)
	}
	if got := evalJS[string](t, b, `document.querySelector('#code').textContent`); got != quarantinedCode {
		t.Errorf("the quarantined code renders as %q, want the text %q", got, quarantinedCode)
	}
	b.do(t, "release", chromedp.Click(chromedp.CSS(`#record [data-action="release"]`)),
		until(`document.querySelector('#record [data-confirm="yes"]')`))
	b.screenshot(t, "quarantined.png")
	if n := app.Count("2captcha:7700"); n != 0 {
		t.Fatalf("the app got 2captcha:7700 %d times before the release was confirmed", n)
	}
	b.do(t, "confirm the release", chromedp.Click(chromedp.CSS(`#record [data-confirm="yes"]`)),
		until(`document.querySelector('#record .state').textContent === 'delivered'`),
		until(`document.querySelector('#record').innerText.includes('Released: delivered.')`))
	wantDelivery(t, app, "2captcha:7700", quarantinedCode, "/cbq", store.VerifiedNone, "false", "replay")
	if rec := getRecord(t, "2captcha", "7700"); rec.State != store.StateDelivered {
		t.Errorf("7700 after the release: %s, want delivered", rec.State)
	}

	// Under handle_path /console/* of localhost: bulk replay of the rest,
	// with its progress to the end.
	b.do(t, "dead letters under /console/", chromedp.Navigate(consoleSub+"?state=parked&provider=2captcha"),
		until(`document.querySelectorAll('#records [data-key]').length === 5`),
		chromedp.Click(chromedp.CSS(`#bulk-replay`)),
		chromedp.Click(chromedp.CSS(`#bulk [data-confirm="yes"]`)),
		until(`(document.querySelector('#bulk-progress')||{}).dataset?.status === 'done'`))
	if got := evalJS[string](t, b, `document.querySelector('#bulk-progress').textContent`); !strings.Contains(got, fmt.Sprintf("done, %d/%d done, %d delivered, 0 failed", bulk, bulk, bulk)) {
		t.Errorf("bulk progress %q, want %d/%d done and delivered", got, bulk, bulk)
	}
	b.do(t, "list after the bulk replay", until(`document.querySelector('#records').innerText.includes('No stored result matches')`))
	for i := range bulk {
		key := "2captcha:" + strconv.Itoa(7501+i)
		if rec := getRecord(t, "2captcha", strconv.Itoa(7501+i)); rec.State != store.StateDelivered || app.Deliveries(key) != 1 {
			t.Errorf("%s after the bulk replay: %s, %d deliveries; want delivered once", key, rec.State, app.Deliveries(key))
		}
	}

	// The received-time filter: shown where the list applies it.
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	b.do(t, "received-time filter", chromedp.Navigate(consoleSub+"?view=records&state=delivered&received_after="+future),
		until(`document.querySelector('#records').innerText.includes('No stored result matches')`))
	if _, body := adminDo(t, http.MethodGet, "/pingback/records?limit=1", ""); strings.HasPrefix(string(body), "{") {
		if hidden := evalJS[bool](t, b, `document.querySelector('label.range').hidden`); hidden {
			t.Error("the list filters by received time, yet the page hides the filter")
		}
	} else if text := evalJS[string](t, b, `document.querySelector('#records').innerText`); !strings.Contains(text, "without the received-time filter") {
		t.Errorf("the list ignores received_after, and the page does not say so: %q", text)
	}

	// The tasks.
	b.do(t, "tasks", chromedp.Navigate(consoleSub+"?view=tasks&state=pending"),
		until(`document.querySelector('#tasks [data-key="2captcha:7600"]')`))
	if got := evalJS[string](t, b, `document.querySelector('#tasks [data-key="2captcha:7600"]').dataset.account`); got != acct {
		t.Errorf("task 2captcha:7600 labelled with account %q, want %q", got, acct)
	}
	if text := evalJS[string](t, b, `document.querySelector('#tasks [data-key="2captcha:7600"]').innerText`); !strings.Contains(text, "account\n"+acct) {
		t.Errorf("task 2captcha:7600 reads %q, want its account %s", text, acct)
	}
	b.do(t, "one account's tasks", chromedp.Navigate(consoleSub+"?view=tasks&state=pending&account="+acct),
		until(`document.querySelector('#tasks [data-key="2captcha:7600"]')`))
	if got := evalJS[string](t, b, `document.querySelector('input[name="account"]').value`); got != acct {
		t.Errorf("the account filter reads %q, want %q", got, acct)
	}
	b.do(t, "another account's tasks", chromedp.Navigate(consoleSub+"?view=tasks&state=pending&account=0000000000000000"),
		until(`document.querySelector('#tasks').innerText.includes('No tracked task matches')`))

	// A phone: 390×844, every view without horizontal scrolling.
	b.do(t, "phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulateScale(2)))
	for _, v := range []struct{ name, url, ready string }{
		{"overview", consoleRoot, `document.querySelector('[data-provider="2captcha"]')`},
		{"dead letters", consoleRoot + "?view=records&provider=2captcha", `document.querySelectorAll('#records [data-key]').length > 0`},
		{"record", consoleRoot + "?view=record&provider=2captcha&id=7500", `document.querySelector('#record #code')`},
		{"tasks", consoleSub + "?view=tasks", `document.querySelector('#tasks [data-key]')`},
	} {
		b.do(t, "phone "+v.name, chromedp.Navigate(v.url), until(v.ready))
		noHorizontalScroll(t, b, v.name)
		if v.name == "record" {
			b.screenshot(t, "record-phone.png")
		}
	}

	// Purge: offered only where the admin API has it, one result and all
	// matching, each after a confirmation.
	b.do(t, "purge probe", chromedp.Navigate(consoleSub+"?view=record&provider=2captcha&id=7501"),
		until(`document.querySelector('#record') && document.body.dataset.purge`))
	if status, _ := adminDo(t, http.MethodPost, "/pingback/purges", ""); status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
		t.Log("the admin API has no purge: checking that the page offers none")
		if n := evalJS[int](t, b, `document.querySelectorAll('[data-action="purge"], #bulk-purge').length`); n != 0 ||
			evalJS[string](t, b, `document.body.dataset.purge`) != "no" {
			t.Errorf("the admin API has no purge, yet the page shows %d purge buttons", n)
		}
		return
	}
	t.Log("the admin API has purge: purging through the page")
	b.do(t, "purge one", chromedp.Click(chromedp.CSS(`[data-action="purge"]`)),
		until(`document.querySelector('#record [data-confirm="yes"]')`))
	if status, _ := adminDo(t, http.MethodGet, "/pingback/records/2captcha/7501", ""); status != http.StatusOK {
		t.Fatalf("7501 gone before the purge was confirmed: %d", status)
	}
	b.do(t, "confirm the purge", chromedp.Click(chromedp.CSS(`#record [data-confirm="yes"]`)),
		until(`document.querySelector('#record').innerText.includes('Purged.')`))
	if status, body := adminDo(t, http.MethodGet, "/pingback/records/2captcha/7501", ""); status != http.StatusNotFound {
		t.Errorf("after purge: %d %s, want 404", status, body)
	}
	b.do(t, "purge all delivered", chromedp.Navigate(consoleSub+"?state=delivered&provider=2captcha"),
		until(`document.querySelectorAll('#records [data-key]').length === 6`),
		chromedp.Click(chromedp.CSS(`#bulk-purge`)),
		chromedp.Click(chromedp.CSS(`#bulk [data-confirm="yes"]`)),
		until(`document.querySelector('#bulk').innerText.includes('Purged 6 results.')`),
		until(`document.querySelector('#records').innerText.includes('No stored result matches')`))
	for _, id := range []string{"7500", "7501", "7502", "7503", "7504", "7505", "7700"} {
		if status, _ := adminDo(t, http.MethodGet, "/pingback/records/2captcha/"+id, ""); status != http.StatusNotFound {
			t.Errorf("2captcha:%s after the bulk purge: %d, want 404", id, status)
		}
	}
}

// statusRoutes rewrites the "routes" of the console's api/status answers
// in a browser tab: each 200 answer of the running Caddy reaches the page
// with "routes" replaced by what routes returns at that moment, the rest
// as Caddy sent it. It intercepts the response in Chromium (Fetch
// domain), so the page's code and its request are the real ones.
type statusRoutes struct {
	mu     sync.Mutex
	routes map[string]adminapi.RouteStatus
	// more replaces other fields of the answer too (field → value), as
	// routes replaces "routes".
	more map[string]any
	errs []string
}

func (s *statusRoutes) set(routes map[string]adminapi.RouteStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routes = routes
}

// intercept starts rewriting the tab's api/status answers.
func (s *statusRoutes) intercept(t *testing.T, b *browserTab) {
	t.Helper()
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, e := range s.errs {
			t.Errorf("rewriting api/status: %s", e)
		}
	})
	b.do(t, "intercepting api/status", func(ctx context.Context, tgt *chromedp.Target) (chromedp.Void, error) {
		// Subscribed on the tab's context: events arrive after this step.
		paused := cdp.Events(b.ctx, tgt, fetch.RequestPaused)
		if _, err := cdp.Call(ctx, tgt, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{
			{URLPattern: "*/api/status", RequestStage: fetch.RequestStageResponse},
		}}); err != nil {
			return chromedp.Void{}, err
		}
		go func() {
			for ev, err := range paused {
				if err != nil {
					return
				}
				go s.answer(b.ctx, tgt, ev)
			}
		}()
		return chromedp.Void{}, nil
	})
}

// answer fulfils one paused api/status request: Caddy's answer, with
// "routes" replaced when it is a 200.
func (s *statusRoutes) answer(ctx context.Context, tgt *chromedp.Target, ev fetch.EventRequestPaused) {
	fail := func(err error) {
		s.mu.Lock()
		s.errs = append(s.errs, err.Error())
		s.mu.Unlock()
		_, _ = cdp.Call(ctx, tgt, fetch.FailRequest, fetch.FailRequestParams{RequestID: ev.RequestID, ErrorReason: "Failed"})
	}
	body, err := cdp.Call(ctx, tgt, fetch.GetResponseBody, fetch.GetResponseBodyParams{RequestID: ev.RequestID})
	if err != nil {
		fail(err)
		return
	}
	out := body.Body
	if ev.ResponseStatusCode == http.StatusOK {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(body.Body, &fields); err != nil {
			fail(fmt.Errorf("%s: %w", body.Body, err))
			return
		}
		if _, ok := fields["routes"]; !ok {
			fail(fmt.Errorf("the answer has no routes: %s", body.Body))
			return
		}
		s.mu.Lock()
		fields["routes"], err = json.Marshal(s.routes)
		for k, v := range s.more {
			if err == nil {
				fields[k], err = json.Marshal(v)
			}
		}
		s.mu.Unlock()
		if err == nil {
			out, err = json.Marshal(fields)
		}
		if err != nil {
			fail(err)
			return
		}
	}
	var headers []*fetch.HeaderEntry
	for _, h := range ev.ResponseHeaders {
		if !strings.EqualFold(h.Name, "Content-Length") {
			headers = append(headers, h)
		}
	}
	if _, err := cdp.Call(ctx, tgt, fetch.FulfillRequest, fetch.FulfillRequestParams{
		RequestID: ev.RequestID, ResponseCode: ev.ResponseStatusCode, ResponseHeaders: headers, Body: out,
	}); err != nil && ctx.Err() == nil {
		fail(err)
	}
}

// TestConsoleRoutes drives the overview in Chromium with the routes of
// GET /pingback/status: with none held back (Caddy's own answer, and then
// an empty "routes") it shows nothing about routes; with routes held back
// it lists each, sorted, with until when its replays are paused (or "not
// paused") and its replay concurrency "n of max", route names rendered as
// text; the section leaves by itself at the next refresh once no route is
// held back, and the page fits a 390 px phone with a long route.
func TestConsoleRoutes(t *testing.T) {
	b := newBrowserTab(t)
	app := newAppStub(t)
	startCaddy(t, "", consoleSites(app))

	// Caddy's answer as it is: no route held back, no section.
	b.do(t, "overview", chromedp.Navigate(consoleRoot),
		until(`[...document.querySelectorAll('h2')].some((h) => h.textContent === 'Loops and store')`))
	if n := evalJS[int](t, b, `document.querySelectorAll('#routes, [data-route]').length`); n != 0 ||
		strings.Contains(evalJS[string](t, b, `document.body.innerText`), "Routes held back") {
		t.Errorf("no route is held back, yet the overview shows %d route elements", n)
	}

	s := &statusRoutes{routes: map[string]adminapi.RouteStatus{}}
	s.intercept(t, b)
	paused := time.Now().Add(10 * time.Minute).UTC().Truncate(time.Second)
	long := "app.example/" + strings.Repeat("pingback-", 20) + "2captcha"
	evil := "app.example/" + consoleXSS
	s.set(map[string]adminapi.RouteStatus{
		"app.example/cb":   {PausedUntil: &paused, Concurrency: 1, Max: 4},
		"app.example/json": {Concurrency: 3, Max: 4},
		long:               {Concurrency: 2, Max: 4},
		evil:               {Concurrency: 2, Max: 4},
	})
	b.do(t, "overview with routes held back", chromedp.Navigate(consoleRoot),
		until(`document.querySelectorAll('#routes [data-route]').length === 4`))
	order := evalJS[[]string](t, b, `[...document.querySelectorAll('#routes [data-route]')].map((e) => e.dataset.route)`)
	if want := []string{"app.example/" + consoleXSS, "app.example/cb", "app.example/json", long}; !slices.Equal(order, want) {
		t.Errorf("routes shown in the order %q, want %q", order, want)
	}
	for _, tc := range []struct{ route, has, hasNot string }{
		{"app.example/cb", "paused until\n" + paused.Format("2006-01-02 15:04:05Z") + " (in 10m)", "not paused"},
		{"app.example/cb", "replay concurrency\n1 of 4", ""},
		{"app.example/json", "paused until\nnot paused", ""},
		{"app.example/json", "replay concurrency\n3 of 4", ""},
		{long, long, ""},
	} {
		text := evalJS[string](t, b, `[...document.querySelectorAll('#routes [data-route]')].find((e) => e.dataset.route === `+strconv.Quote(tc.route)+`).innerText`)
		if !strings.Contains(text, tc.has) || tc.hasNot != "" && strings.Contains(text, tc.hasNot) {
			t.Errorf("route %s reads %q, want %q in it (and not %q)", tc.route, text, tc.has, tc.hasNot)
		}
	}
	if got := evalJS[string](t, b, `document.querySelector('[data-route] h3').textContent`); got != evil {
		t.Errorf("the route %q renders as %q, want it as text", evil, got)
	}
	if n := evalJS[int](t, b, `document.querySelectorAll('main img, main script').length`); n != 0 || evalJS[bool](t, b, `window.__xss !== undefined`) {
		t.Errorf("a route's name became markup: %d img or script elements", n)
	}
	if text := evalJS[string](t, b, `document.querySelector('#routes').innerText`); strings.Contains(text, "undefined") || strings.Contains(text, "[object") {
		t.Errorf("routes read %q: a value rendered as undefined or [object ...]", text)
	}
	b.screenshot(t, "routes.png")

	b.do(t, "phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulateScale(2)),
		chromedp.Navigate(consoleRoot), until(`document.querySelectorAll('#routes [data-route]').length === 4`))
	noHorizontalScroll(t, b, "overview with routes")

	// Recovered: the overview's refresh (every 5 s) drops the section.
	s.set(map[string]adminapi.RouteStatus{})
	b.do(t, "routes recovered", until(`!document.querySelector('#routes') && !document.body.innerText.includes('Routes held back')`),
		until(`[...document.querySelectorAll('h2')].some((h) => h.textContent === 'Loops and store')`))
}

// TestConsoleAccounts drives the overview in Chromium with the accounts
// of GET /pingback/status rewritten in the tab (a rotation under way and
// a key this Caddy does not have): the provider's card shows its
// unpollable tasks, and each account, sorted by id, with its api_key
// entry ("not in api_key" for the unknown one), its pending tasks as a
// link to that account's pending tasks, its unpollable tasks when there
// are any, and its budget; the page fits a 390 px phone.
func TestConsoleAccounts(t *testing.T) {
	b := newBrowserTab(t)
	app := newAppStub(t)
	startCaddy(t, trkGlobal, consoleSites(app))

	const oldID, newID, unknownID = "0c41d8e2a5b79f13", "f3a9c2d17b604e58", "9e0b7a6c5d4f3e21"
	s := &statusRoutes{routes: map[string]adminapi.RouteStatus{}, more: map[string]any{
		"tasks": map[string]adminapi.TaskStatus{"2captcha": {Pending: 9, Unpollable: 2, OldestPendingAgeSeconds: 40}},
		"accounts": map[string]map[string]adminapi.AccountStatus{"2captcha": {
			newID:     {APIKeyEntry: "{env.CAPTCHA_KEY_NEW}", Used: 3, Left: 1197, Pending: 4},
			oldID:     {APIKeyEntry: "{env.CAPTCHA_KEY_OLD}", Used: 120, Left: 1080, Pending: 3},
			unknownID: {Pending: 2, Unpollable: 2},
		}},
	}}
	s.intercept(t, b)
	b.do(t, "overview with accounts", chromedp.Navigate(consoleRoot),
		until(`document.querySelectorAll('[data-provider="2captcha"] [data-account]').length === 3`))
	order := evalJS[[]string](t, b, `[...document.querySelectorAll('[data-provider="2captcha"] [data-account]')].map((e) => e.dataset.account)`)
	if want := []string{oldID, unknownID, newID}; !slices.Equal(order, want) {
		t.Errorf("accounts shown in the order %q, want %q", order, want)
	}
	if text := evalJS[string](t, b, `document.querySelector('[data-provider="2captcha"] .kv').innerText`); !strings.Contains(text, "unpollable\n2") {
		t.Errorf("the provider reads %q, want 2 unpollable tasks", text)
	}
	account := func(id string) string {
		return evalJS[string](t, b, `document.querySelector('[data-account="`+id+`"]').innerText`)
	}
	for _, tc := range []struct{ id, has, hasNot string }{
		{oldID, "{env.CAPTCHA_KEY_OLD}", "unpollable"},
		{oldID, "pending\n3", ""},
		{oldID, "budget\nused 120, left 1080", ""},
		{newID, "{env.CAPTCHA_KEY_NEW}", "unpollable"},
		{newID, "pending\n4", ""},
		{unknownID, "not in api_key", "{env."},
		{unknownID, "unpollable\n2", ""},
	} {
		if text := account(tc.id); !strings.Contains(text, tc.has) || tc.hasNot != "" && strings.Contains(text, tc.hasNot) {
			t.Errorf("account %s reads %q, want %q in it (and not %q)", tc.id, text, tc.has, tc.hasNot)
		}
	}
	if text := evalJS[string](t, b, `document.querySelector('[data-provider="2captcha"]').innerText`); strings.Contains(text, "undefined") || strings.Contains(text, "[object") {
		t.Errorf("the provider reads %q: a value rendered as undefined or [object ...]", text)
	}
	b.screenshot(t, "accounts.png")

	b.do(t, "phone viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulateScale(2)),
		chromedp.Navigate(consoleRoot), until(`document.querySelectorAll('[data-account]').length === 3`))
	noHorizontalScroll(t, b, "overview with accounts")

	// An account's pending count links to its pending tasks.
	b.do(t, "an account's tasks", chromedp.Click(chromedp.CSS(`[data-account="`+oldID+`"] a`)),
		until(`document.body.dataset.view === 'tasks' && document.querySelector('#tasks').innerText.includes('No tracked task matches')`))
	q, err := url.ParseQuery(strings.TrimPrefix(evalJS[string](t, b, `location.search`), "?"))
	if err != nil || q.Get("provider") != "2captcha" || q.Get("account") != oldID || q.Get("state") != "pending" {
		t.Errorf("the account's link leads to %v (%v), want provider 2captcha, account %s, state pending", q, err, oldID)
	}
}
