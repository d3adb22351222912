package pingback

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// How the start-up window is tested: the store open is held by a fault
// (storeFaults.beforeOpen) inside a real config load (caddy.Load, in a goroutine
// of its own), so the window lasts as long as the test wants. This is
// honest because Caddy serves its admin endpoint during a load: Load takes
// the config lock (rawCfgMu) and runs the new config, whose admin server is
// started (provisionContext, replaceLocalAdminServer) before any app is
// provisioned or started, and the plugin's admin routes take neither that
// lock nor currentCtxMu for long (caddy.ActiveContext). Only /config/ and
// /load would wait for the lock; the test does not use them.
//
// Caddy starts a config's apps in a random order (a map). A pingback can
// reach the handler in the window only if the http app started before the
// pingback app; the hook reports whether the config's HTTP servers already
// listen, and a load in the other order is let through, unloaded and
// tried again (each load has even odds).

// heldLoad is a config load whose store open is held.
type heldLoad struct {
	httpUp  bool   // the config's HTTP servers listened when the open was held
	release func() // lets the open go on; later calls do nothing
	wait    func() error
}

// startHeld loads cfg in the background, its store (the pingback app's
// storage_dir) opened through pingback.stores.test_faults, which holds the
// open, and returns once the pingback app's Start is about to open the
// store. At test end the open is released and the load awaited
// (before the unload that earlier cleanups do).
func startHeld(t *testing.T, cfg []byte) *heldLoad {
	t.Helper()
	held := make(chan bool, 1)
	rel := make(chan struct{})
	cfg = withStoreFaults(t, cfg, &storeFaults{beforeOpen: func(ctx caddy.Context) {
		held <- httpListening(ctx)
		<-rel
	}})
	done := make(chan error, 1)
	go func() { done <- caddy.Load(cfg, true) }()
	var relOnce, waitOnce sync.Once
	var loadErr error
	l := &heldLoad{
		release: func() { relOnce.Do(func() { close(rel) }) },
		wait: func() error {
			waitOnce.Do(func() { loadErr = <-done })
			return loadErr
		},
	}
	t.Cleanup(func() {
		l.release()
		_ = l.wait()
	})
	select {
	case l.httpUp = <-held:
		return l
	case err := <-done:
		waitOnce.Do(func() { loadErr = err })
		t.Fatalf("the load ended without opening a store: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no store open within 30s of the load")
	}
	return nil
}

// httpListening reports whether the HTTP servers of ctx's config listen
// (the http app started before the pingback app).
func httpListening(ctx caddy.Context) bool {
	v, err := ctx.App("http")
	if err != nil {
		return false
	}
	for _, srv := range v.(*caddyhttp.App).Servers {
		if len(srv.Listeners()) == 0 {
			return false
		}
	}
	return true
}

// adminDuringLoad sends an admin request while a config loads and returns
// the status and body. Caddy starts the new config's admin server and
// stops the previous one in the background (replaceLocalAdminServer), so a
// connection the previous one accepted as it shut down gets no answer:
// such a request is sent again, for up to 10 s.
func adminDuringLoad(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, err := http.NewRequest(method, "http://"+testAdmin+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := client.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil {
				return resp.StatusCode, strings.TrimSpace(string(b))
			}
			err = rerr
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

// startingRequests are requests to every admin route (by pattern, as
// Routes lists them), for the start-up window.
var startingRequests = map[string][]struct{ method, path, body string }{
	"/pingback/tasks": {{"POST", "/pingback/tasks", `{"provider":"captchaai","id":"1","pingback_url":"http://localhost/cb"}`},
		{"GET", "/pingback/tasks", ""}},
	"/pingback/records": {{"GET", "/pingback/records?state=failed", ""}},
	"/pingback/records/": {{"GET", "/pingback/records/captchaai/1", ""}, {"DELETE", "/pingback/records/captchaai/1", ""},
		{"POST", "/pingback/records/captchaai/1/replay", ""}, {"POST", "/pingback/records/captchaai/1/release", ""}},
	"/pingback/tasks/":      {{"GET", "/pingback/tasks/captchaai/1", ""}},
	"/pingback/status":      {{"GET", "/pingback/status", ""}},
	"/pingback/replays":     {{"POST", "/pingback/replays", `{"state":"failed"}`}},
	"/pingback/replays/":    {{"GET", "/pingback/replays/1", ""}, {"DELETE", "/pingback/replays/1", ""}},
	"/pingback/purges":      {{"POST", "/pingback/purges", `{"state":"failed"}`}},
	"/pingback/pauses":      {{"GET", "/pingback/pauses", ""}, {"POST", "/pingback/pauses", `{"provider":"captchaai"}`}},
	"/pingback/pauses/":     {{"DELETE", "/pingback/pauses/captchaai", ""}},
	"/pingback/history":     {{"GET", "/pingback/history", ""}},
	"/pingback/deadletters": {{"GET", "/pingback/deadletters", ""}},
}

// wantStarting checks that every admin route answers 503 {"error":
// "starting: the store is opening"}.
func wantStarting(t *testing.T) {
	t.Helper()
	for _, rt := range (adminAPI{}).Routes() {
		reqs, ok := startingRequests[rt.Pattern]
		if !ok {
			t.Errorf("admin route %s has no request in startingRequests", rt.Pattern)
		}
		for _, rq := range reqs {
			status, body := adminDuringLoad(t, rq.method, rq.path, rq.body)
			if status != http.StatusServiceUnavailable || body != `{"error":"starting: the store is opening"}` {
				t.Errorf("%s %s while the store opens: %d %s, want 503 {\"error\":\"starting: the store is opening\"}", rq.method, rq.path, status, body)
			}
		}
	}
}

// providerAnswer is what a provider's pingback got.
type providerAnswer struct {
	status int
	body   string
	err    error
}

// getPingback sends a captchaai GET pingback to url and returns its
// answer; it may run in any goroutine.
func getPingback(url string) providerAnswer {
	resp, err := http.Get(url)
	if err != nil {
		return providerAnswer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return providerAnswer{status: resp.StatusCode, body: string(b), err: err}
}

// TestStartupWindow: while the store opens at start-up, every admin route
// answers 503 "starting: the store is opening"; a pingback sent then waits
// for the store and is answered 200 and stored once it is open; one whose
// ack_timeout passes first gets 503 "result not stored" at ack_timeout,
// is not stored, and is forwarded without durability (as when the store
// is down).
func TestStartupWindow(t *testing.T) {
	app := newAppStub(t)
	dir := t.TempDir()
	const shortAck = 300 * time.Millisecond
	sites := fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider captchaai
			ack_timeout 30s
		}
		reverse_proxy %s
	}
	handle /short {
		pingback {
			provider captchaai
			ack_timeout %s
		}
		reverse_proxy %s
	}
}
`, testHTTPPort, app.HostPort(), shortAck, app.HostPort())
	cfg := adaptCaddyfile(t, caddyfileFor("storage_dir "+dir, sites))
	t.Cleanup(func() { unloadCaddy(t) })

	var l *heldLoad
	for attempt := 1; ; attempt++ {
		l = startHeld(t, cfg)
		if l.httpUp {
			t.Logf("load %d started the http app before the pingback app", attempt)
			break
		}
		// The pingback app started first: no pingback reaches the
		// handler in this window. Let the load finish and load again.
		l.release()
		if err := l.wait(); err != nil {
			t.Fatalf("loading config: %v", err)
		}
		if attempt == 40 {
			t.Fatal("40 loads in a row started the pingback app before the http app")
		}
		unloadCaddy(t)
	}

	wantStarting(t)

	long := make(chan providerAnswer, 1)
	go func() { long <- getPingback(testBase + "/cb?id=101&code=TOKEN-101") }()
	sent := time.Now()
	short := getPingback(testBase + "/short?id=102&code=TOKEN-102")
	waited := time.Since(sent)
	if short.err != nil || short.status != http.StatusServiceUnavailable || short.body != "result not stored" {
		t.Fatalf("pingback whose ack_timeout passed while the store opens: %d %q (%v), want 503 \"result not stored\"", short.status, short.body, short.err)
	}
	if waited < shortAck {
		t.Errorf("pingback answered after %s, before its ack_timeout %s: it did not wait for the store", waited, shortAck)
	}
	select {
	case a := <-long:
		t.Fatalf("pingback answered while the store open is held: %d %q (%v)", a.status, a.body, a.err)
	default:
	}

	l.release()
	if err := l.wait(); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	select {
	case a := <-long:
		if a.err != nil || a.status != http.StatusOK || a.body != "OK" {
			t.Fatalf("pingback that waited for the store: %d %q (%v), want 200 \"OK\"", a.status, a.body, a.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the pingback that waited for the store got no answer within 20s of the open")
	}
	waitForState(t, 5*time.Second, "captchaai", "101", store.StateDelivered)
	if n := app.Count("captchaai:101"); n != 1 {
		t.Errorf("app received captchaai:101 %d times, want 1", n)
	}

	// The late one changed nothing in the store; it was forwarded once,
	// without durability.
	testkit.WaitFor(t, 5*time.Second, "the unstored forward of captchaai:102", func() bool { return app.Count("captchaai:102") == 1 })
	if _, err := runningApp(t).store(time.Second).Get(context.Background(), store.Key{Provider: "captchaai", ID: "102"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("get captchaai:102 after the open: %v, want store.ErrNotFound", err)
	}

	if status, body := adminDuringLoad(t, "GET", "/pingback/status", ""); status != http.StatusOK {
		t.Errorf("GET /pingback/status once started: %d %s, want 200", status, body)
	}
}

// TestStartupAdminAnswers: what /pingback/status answers while a store open
// is held and after it, on a first start, on a reload (the running config's
// store answers) and for an open that fails (answers as before the load).
func TestStartupAdminAnswers(t *testing.T) {
	for _, tc := range []struct {
		name       string
		running    bool   // a config with a pingback app runs before the load
		badStore   bool   // storage_dir is a regular file: the open fails
		duringCode int    // the answer while the open is held
		duringBody string // a substring of it
		afterCode  int    // the answer after the load
		afterBody  string
	}{
		{name: "first start", duringCode: 503, duringBody: `{"error":"starting: the store is opening"}`,
			afterCode: 200, afterBody: `"records"`},
		{name: "reload", running: true, duringCode: 200, duringBody: `"records"`,
			afterCode: 200, afterBody: `"records"`},
		{name: "open fails", badStore: true, duringCode: 503, duringBody: `{"error":"starting: the store is opening"}`,
			afterCode: 503, afterBody: "pingback app not running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			app := newAppStub(t)
			before, dir := t.TempDir(), t.TempDir() // removed after the unload
			t.Cleanup(func() { unloadCaddy(t) })
			if tc.running {
				loadCaddyfile(t, caddyfileFor("storage_dir "+before, pingbackSite("captchaai", "", app)))
			}
			if tc.badStore {
				dir += "/file"
				if err := os.WriteFile(dir, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			l := startHeld(t, adaptCaddyfile(t, caddyfileFor("storage_dir "+dir, pingbackSite("captchaai", "", app))))
			if status, body := adminDuringLoad(t, "GET", "/pingback/status", ""); status != tc.duringCode || !strings.Contains(body, tc.duringBody) {
				t.Errorf("while the open is held: %d %s, want %d with %s", status, body, tc.duringCode, tc.duringBody)
			}
			l.release()
			if err := l.wait(); (err != nil) != tc.badStore {
				t.Fatalf("load: %v (want an error: %t)", err, tc.badStore)
			}
			if status, body := adminDuringLoad(t, "GET", "/pingback/status", ""); status != tc.afterCode || !strings.Contains(body, tc.afterBody) {
				t.Errorf("after the load: %d %s, want %d with %s", status, body, tc.afterCode, tc.afterBody)
			}
		})
	}
}
