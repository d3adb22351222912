package pingback

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Tests in this package run a real Caddy in-process on fixed ports (admin
// 2999, HTTP 9080), so packages must run serially (go test -p 1) and tests
// here must not use t.Parallel. PINGBACK_TEST_ADMIN_PORT and
// PINGBACK_TEST_HTTP_PORT move them, for running two test binaries at once.
var (
	testAdmin    = "localhost:" + envPort("PINGBACK_TEST_ADMIN_PORT", 2999)
	testHTTPPort = envPort("PINGBACK_TEST_HTTP_PORT", 9080)
	testBase     = "http://localhost:" + testHTTPPort
)

func envPort(name string, def int) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return strconv.Itoa(def)
}

// startCaddy loads a Caddyfile made of the test globals, the given lines of
// the global pingback block (storage_dir is added: a fresh temp dir unless
// the lines name one) and the site blocks, as a real config load. It returns
// the storage directory. At test end an empty config is loaded, which closes
// the store before the temp dir is removed.
func startCaddy(t *testing.T, pingbackGlobal, sites string) string {
	t.Helper()
	dir := t.TempDir() // registered first: removed after the unload below
	if !strings.Contains(pingbackGlobal, "storage_dir") {
		pingbackGlobal = "storage_dir " + dir + "\n" + pingbackGlobal
	}
	loadCaddyfile(t, caddyfileFor(pingbackGlobal, sites))
	t.Cleanup(func() { unloadCaddy(t) })
	return dir
}

// caddyfileFor builds a whole test Caddyfile.
func caddyfileFor(pingbackGlobal, sites string) string {
	return fmt.Sprintf(`{
	admin %s
	http_port %s
	https_port 9443
	grace_period 1ns
	auto_https off
	skip_install_trust
	persist_config off
	pingback {
		%s
	}
}
%s
`, testAdmin, testHTTPPort, pingbackGlobal, sites)
}

// loadCaddyfile adapts and loads a Caddyfile in-process.
func loadCaddyfile(t *testing.T, caddyfile string) {
	t.Helper()
	cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, caddyfile)
	}
	for _, w := range warn {
		t.Logf("adapt warning: %s", w.Message)
	}
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
}

// unloadCaddy loads a config without the pingback app or any server.
func unloadCaddy(t *testing.T) {
	t.Helper()
	cfg := fmt.Sprintf(`{"admin":{"listen":%q,"config":{"persist":false}}}`, testAdmin)
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Errorf("unloading config: %v", err)
	}
}

// runningApp returns the pingback app of the running config.
func runningApp(t *testing.T) *App {
	t.Helper()
	v, err := caddy.ActiveContext().App("pingback")
	if err != nil {
		t.Fatalf("pingback app: %v", err)
	}
	return v.(*App)
}

// getRecord reads a record from the running config's store.
func getRecord(t *testing.T, provider, id string) *store.Record {
	t.Helper()
	st := runningApp(t).store(time.Second)
	if st == nil {
		t.Fatal("store not open")
	}
	rec, err := st.Get(context.Background(), store.Key{Provider: provider, ID: id})
	if err != nil {
		t.Fatalf("get %s:%s: %v", provider, id, err)
	}
	return rec
}

// waitFor polls cond every 10ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// seenRequest is a request as the app stand-in received it.
type seenRequest struct {
	Method string
	URI    string
	Host   string
	Header http.Header
	Body   string
	At     time.Time // when it arrived
}

// appStub is a real HTTP app on loopback that records what it receives and
// answers as told.
type appStub struct {
	*httptest.Server

	mu      sync.Mutex
	reqs    []seenRequest
	status  int           // answer status; 200 if 0
	delay   time.Duration // wait before answering
	release chan struct{} // if set, answers wait until it is closed

	// statusFor, if set, picks each answer's status (over status).
	statusFor func(r *http.Request) int
	// delayFor, if set, picks each answer's delay (over delay).
	delayFor func(r *http.Request) time.Duration
	// answered counts, by idempotency key, the answers below 400 written
	// while the request was still live (Caddy had not cut it): deliveries.
	answered map[string]int
	// inflight counts requests being answered; maxInflight is its peak.
	inflight, maxInflight int
}

func newAppStub(t *testing.T) *appStub {
	a := &appStub{}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

func (a *appStub) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.reqs = append(a.reqs, seenRequest{Method: r.Method, URI: r.RequestURI, Host: r.Host, Header: r.Header.Clone(), Body: string(body), At: time.Now()})
	status, delay, release, statusFor, delayFor := a.status, a.delay, a.release, a.statusFor, a.delayFor
	a.inflight++
	a.maxInflight = max(a.maxInflight, a.inflight)
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inflight--
		a.mu.Unlock()
	}()
	if statusFor != nil {
		status = statusFor(r)
	}
	if delayFor != nil {
		delay = delayFor(r)
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
		}
	}
	if release != nil {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
	if status == 0 {
		status = http.StatusOK
	}
	if status < 400 && r.Context().Err() == nil {
		a.mu.Lock()
		if a.answered == nil {
			a.answered = make(map[string]int)
		}
		a.answered[r.Header.Get(HeaderIdempotencyKey)]++
		a.mu.Unlock()
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "app says hi")
}

// deliveries returns how many times the app answered a request with the
// idempotency key with a status below 400 while Caddy still waited for it.
func (a *appStub) deliveries(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.answered[key]
}

// setStatus makes the app answer with status from now on.
func (a *appStub) setStatus(status int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.status = status
}

// peakInflight returns the most requests the app was answering at once.
func (a *appStub) peakInflight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxInflight
}

// requests returns a copy of what the app received so far.
func (a *appStub) requests() []seenRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]seenRequest(nil), a.reqs...)
}

// count returns how many requests carried the idempotency key.
func (a *appStub) count(key string) int {
	n := 0
	for _, r := range a.requests() {
		if r.Header.Get(HeaderIdempotencyKey) == key {
			n++
		}
	}
	return n
}

// hostPort is the stub's address for a reverse_proxy upstream.
func (a *appStub) hostPort() string { return strings.TrimPrefix(a.URL, "http://") }

// get sends a GET and returns status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// postForm sends an urlencoded POST and returns status and body.
func postForm(t *testing.T, url, form string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/x-www-form-urlencoded", strings.NewReader(form))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// pingbackSite is a site block with one pingback route in front of app.
func pingbackSite(provider, handlerLines string, app *appStub) string {
	return fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider %s
			%s
		}
		reverse_proxy %s
	}
}
`, testHTTPPort, provider, handlerLines, app.hostPort())
}
