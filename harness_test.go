package pingback

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
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

// TestMain turns on the store's self-checks (store.SelfCheck) for every
// test of the package: each answer of the Badger committer's in-memory
// shortcuts is compared with what Badger holds.
func TestMain(m *testing.M) {
	store.SelfCheck = true
	os.Exit(m.Run())
}

// Child Caddy processes (built from ./cmd/caddy) listen on their own ports,
// apart from the in-process Caddy's: admin 2998 and HTTP 9081 unless
// PINGBACK_TEST_CHILD_ADMIN_PORT and PINGBACK_TEST_CHILD_HTTP_PORT say
// otherwise. At most one child runs at a time.
var (
	childAdmin    = "localhost:" + envPort("PINGBACK_TEST_CHILD_ADMIN_PORT", 2998)
	childHTTPPort = envPort("PINGBACK_TEST_CHILD_HTTP_PORT", 9081)
	childBase     = "http://localhost:" + childHTTPPort
)

// caddyBinary is the cmd/caddy binary, built once per test run.
var caddyBinary struct {
	once sync.Once
	path string
	err  error
}

// childCaddyBinary builds ./cmd/caddy once per test run and returns its
// path. The binary lives in the user's cache directory and is replaced
// atomically, so concurrent test runs never see a half-written file.
func childCaddyBinary(t *testing.T) string {
	t.Helper()
	caddyBinary.once.Do(func() {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		dir := filepath.Join(base, "caddy-pingback-test")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			caddyBinary.err = err
			return
		}
		tmp, err := os.CreateTemp(dir, "caddy-*.tmp")
		if err != nil {
			caddyBinary.err = err
			return
		}
		_ = tmp.Close()
		defer os.Remove(tmp.Name()) // a no-op once renamed
		start := time.Now()
		out, err := exec.Command("go", "build", "-o", tmp.Name(), "./cmd/caddy").CombinedOutput()
		if err != nil {
			caddyBinary.err = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
			return
		}
		// One binary per checkout: test runs of other checkouts (other
		// branches) on the same machine must not replace it under this one.
		wd, err := os.Getwd()
		if err != nil {
			caddyBinary.err = err
			return
		}
		final := filepath.Join(dir, fmt.Sprintf("caddy-%x", sha256.Sum256([]byte(wd)))[:len("caddy-")+16])
		if err := os.Rename(tmp.Name(), final); err != nil {
			caddyBinary.err = err
			return
		}
		caddyBinary.path = final
		t.Logf("built %s in %s", final, time.Since(start).Round(time.Millisecond))
	})
	if caddyBinary.err != nil {
		t.Fatalf("building the caddy binary: %v", caddyBinary.err)
	}
	return caddyBinary.path
}

// childEnv is the environment of a child Caddy: Caddy's data and config
// directories in a temp dir, so a child never touches the user's.
func childEnv(t *testing.T) []string {
	home := t.TempDir()
	return append(os.Environ(),
		"XDG_DATA_HOME="+filepath.Join(home, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(home, "config"),
	)
}

// childCaddyfile builds a Caddyfile for a child Caddy on the child ports:
// the global pingback block gets storage_dir dir and the given lines.
func childCaddyfile(dir, pingbackGlobal, sites string) string {
	return fmt.Sprintf(`{
	admin %s
	http_port %s
	auto_https off
	skip_install_trust
	persist_config off
	pingback {
		storage_dir %s
		%s
	}
}
%s
`, childAdmin, childHTTPPort, dir, pingbackGlobal, sites)
}

// childPingbackSite is pingbackSite for the child's HTTP port, proxying to
// upstream (host:port).
func childPingbackSite(upstream string) string {
	return fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider captchaai
		}
		reverse_proxy %s
	}
}
`, childHTTPPort, upstream)
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// childCaddy is a Caddy process running a Caddyfile.
type childCaddy struct {
	t      *testing.T
	admin  string // admin address (host:port)
	base   string // HTTP base URL
	cmd    *exec.Cmd
	output *syncBuffer   // stdout and stderr (Caddy logs to stderr)
	exited chan struct{} // closed once the process has been waited for
	state  *os.ProcessState
}

// startChildCaddy runs `caddy run` on caddyfile and waits until it serves:
// its admin endpoint answers, the pingback store is open and its HTTP port
// answers. The process is killed at test end if still running, and its
// output is logged if the test failed.
func startChildCaddy(t *testing.T, caddyfile string) *childCaddy {
	t.Helper()
	return startChildCaddyAt(t, caddyfile, childAdmin, childBase)
}

// startChildCaddyAt is startChildCaddy for a child whose Caddyfile sets
// admin address admin and serves base (a second child beside the first).
func startChildCaddyAt(t *testing.T, caddyfile, admin, base string) *childCaddy {
	t.Helper()
	c := launchChildCaddy(t, caddyfile, admin, base)
	c.waitReady(30 * time.Second)
	return c
}

// launchChildCaddy starts the child without waiting for it to serve.
func launchChildCaddy(t *testing.T, caddyfile, admin, base string) *childCaddy {
	t.Helper()
	bin := childCaddyBinary(t)
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &childCaddy{t: t, admin: admin, base: base, output: new(syncBuffer), exited: make(chan struct{})}
	c.cmd = exec.Command(bin, "run", "--config", file, "--adapter", "caddyfile")
	c.cmd.Env = childEnv(t)
	c.cmd.Stdout = c.output
	c.cmd.Stderr = c.output
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("starting child caddy: %v", err)
	}
	pid := c.cmd.Process.Pid
	go func() {
		_ = c.cmd.Wait()
		c.state = c.cmd.ProcessState
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("child caddy (pid %d, admin %s) output:\n%s", pid, admin, c.output.String())
		}
	})
	return c
}

// waitReady waits until the child's admin endpoint answers, its log says
// the pingback store is open and its HTTP server answers. It fails the test
// at once if the process exits.
func (c *childCaddy) waitReady(timeout time.Duration) {
	c.t.Helper()
	client := &http.Client{Timeout: time.Second}
	answers := func(url string) bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	}
	waitFor(c.t, timeout, "the child caddy to serve", func() bool {
		select {
		case <-c.exited:
			c.t.Fatalf("child caddy exited during startup (%v):\n%s", c.state, c.output.String())
		default:
		}
		return answers("http://"+c.admin+"/config/") &&
			strings.Contains(c.output.String(), "pingback store ready") &&
			answers(c.base+"/")
	})
}

// kill sends SIGKILL (os.Process.Kill) and returns how the process ended.
func (c *childCaddy) kill() *os.ProcessState {
	c.t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		c.t.Fatalf("killing child caddy: %v", err)
	}
	<-c.exited
	return c.state
}

// stop asks the child to exit through its admin endpoint (a graceful stop,
// like `caddy stop`) and waits until it has.
func (c *childCaddy) stop() {
	c.t.Helper()
	resp, err := http.Post("http://"+c.admin+"/stop", "", nil)
	if err != nil {
		c.t.Fatalf("POST /stop: %v", err)
	}
	resp.Body.Close()
	select {
	case <-c.exited:
	case <-time.After(20 * time.Second):
		c.t.Fatal("child caddy did not exit within 20s of /stop")
	}
	if !c.state.Success() {
		c.t.Fatalf("child caddy exited with %v after /stop", c.state)
	}
}

// unusedLoopbackPort returns a loopback port where nothing listens: it
// listens on an ephemeral port and closes the listener at once, so a
// connection to it is refused (an app that is down) until a test listens
// there again (newAppStubOn).
func unusedLoopbackPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// newAppStubOn is newAppStub on a given loopback port.
func newAppStubOn(t *testing.T, port string) *appStub {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatalf("app stub on port %s: %v", port, err)
	}
	a := &appStub{}
	a.Server = httptest.NewUnstartedServer(http.HandlerFunc(a.serve))
	_ = a.Server.Listener.Close()
	a.Server.Listener = ln
	a.Start()
	t.Cleanup(a.Close)
	return a
}
