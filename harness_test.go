package pingback

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// Tests in this package run a real Caddy in-process. Caddy's config is
// process-wide (one running config, one admin endpoint), so tests here
// run one at a time and must not use t.Parallel. Its ports are free ones
// picked once per test process (testkit.ProcessPort), so this package's
// test binary runs beside other packages' and other checkouts' (go test
// ./... runs packages at once).
//
// Self-checks. Every in-process config that a test loads through
// startCaddy, loadCaddyfile or postLoad opens its storage_dir through the
// test-only store module pingback.stores.test_faults with no faults
// (selfChecked): the production Badger store with its self-checks on
// (badgerstore.Options.SelfCheck: the committer's checks, the counts
// compared with a recount at each open), as do the fault-injecting
// helpers (startCaddyFaults, startCaddyWith, startCaddyWrapped,
// withStoreFaults, startHeld). These keep the production module
// pingback.stores.badger and run without self-checks:
//   - tests that assert what that module shows (TestStatusAndCountGauges:
//     kind "badger" and free_bytes; TestCLI: "store: badger"), through
//     startCaddyBadger;
//   - the store module tests (the Caddyfile and JSON store tables, the
//     PostgreSQL store), which load configs with a store module of their
//     own or assert on the adapted JSON;
//   - tests that load a JSON config with caddy.Load directly: those that
//     want the load to fail (TestConfigErrorsAtStart,
//     TestStorageDirThatCannotBeOpened, TestStorageDirLockedByAnotherProcess,
//     TestStartRefusesSharedStorageDir), whose stores never open, and
//     TestDocJSONExampleServes, which loads the documented JSON as it is;
//   - child Caddy processes (testkit.CaddyBinary), which have only the
//     production modules.
var (
	testAdmin     = "localhost:" + processPort()
	testHTTPPort  = processPort()
	testHTTPSPort = processPort()
	testBase      = "http://localhost:" + testHTTPPort
)

// processPort is testkit.ProcessPort for a package variable's initializer:
// a test process without its ports cannot run at all.
func processPort() string {
	port, err := testkit.ProcessPort()
	if err != nil {
		panic(err)
	}
	return port
}

// startCaddy loads a Caddyfile made of the test globals, the given lines of
// the global pingback block (storage_dir is added: a fresh temp dir unless
// the lines name one) and the site blocks, as a real config load, with the
// store self-checked (loadCaddyfile). It returns the storage directory. At
// test end an empty config is loaded, which closes the store before the
// temp dir is removed.
func startCaddy(t *testing.T, pingbackGlobal, sites string) string {
	t.Helper()
	return startCaddyLoading(t, loadCaddyfile, pingbackGlobal, sites)
}

// startCaddyBadger is startCaddy with the store opened through the
// production module pingback.stores.badger (no self-checks), for tests
// that assert what that module shows.
func startCaddyBadger(t *testing.T, pingbackGlobal, sites string) string {
	t.Helper()
	return startCaddyLoading(t, loadCaddyfileBadger, pingbackGlobal, sites)
}

// startCaddyLoading is startCaddy with the Caddyfile loaded by load.
func startCaddyLoading(t *testing.T, load func(*testing.T, string), pingbackGlobal, sites string) string {
	t.Helper()
	dir := t.TempDir() // registered first: removed after the unload below
	if !strings.Contains(pingbackGlobal, "storage_dir") {
		pingbackGlobal = "storage_dir " + dir + "\n" + pingbackGlobal
	}
	load(t, caddyfileFor(pingbackGlobal, sites))
	t.Cleanup(func() { unloadCaddy(t) })
	return dir
}

// caddyfileFor builds a whole test Caddyfile: testGlobals with the lines
// of the global pingback block, then the site blocks.
func caddyfileFor(pingbackGlobal, sites string) string {
	return testGlobals(pingbackGlobal).Caddyfile(sites)
}

// testGlobals is the global options block of the in-process Caddy: the
// test ports (HTTP, HTTPS, admin), grace_period 1ns and the lines of the
// global pingback block.
func testGlobals(pingbackGlobal string) testkit.Globals {
	return testkit.Globals{
		Admin:       testAdmin,
		HTTPPort:    testHTTPPort,
		HTTPSPort:   testHTTPSPort,
		GracePeriod: "1ns",
		Pingback:    pingbackGlobal,
	}
}

// loadCaddyfile adapts and loads a Caddyfile in-process, with the store of
// its storage_dir opened self-checked (selfChecked).
func loadCaddyfile(t *testing.T, caddyfile string) {
	t.Helper()
	loadAdapted(t, selfChecked(t, adaptWarned(t, caddyfile)))
}

// loadCaddyfileBadger is loadCaddyfile with the store of its storage_dir
// opened through the production module pingback.stores.badger.
func loadCaddyfileBadger(t *testing.T, caddyfile string) {
	t.Helper()
	loadAdapted(t, adaptWarned(t, caddyfile))
}

// adaptWarned adapts a Caddyfile, logging the adapter's warnings.
func adaptWarned(t *testing.T, caddyfile string) []byte {
	t.Helper()
	cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, caddyfile)
	}
	for _, w := range warn {
		t.Logf("adapt warning: %s", w.Message)
	}
	return cfg
}

// loadAdapted loads a JSON config in-process.
func loadAdapted(t *testing.T, cfg []byte) {
	t.Helper()
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

// waitForState waits up to timeout until the record is in state want and
// returns it.
func waitForState(t *testing.T, timeout time.Duration, provider, id string, want store.State) *store.Record {
	t.Helper()
	var rec *store.Record
	testkit.WaitFor(t, timeout, fmt.Sprintf("%s:%s to be %s", provider, id, want), func() bool {
		rec = getRecord(t, provider, id)
		return rec.State == want
	})
	return rec
}

// adminDo sends method path with body (JSON; none if empty) to the
// in-process Caddy's admin endpoint and returns the status and body.
func adminDo(t *testing.T, method, path, body string) (int, []byte) {
	t.Helper()
	a := testkit.Admin(testAdmin).Do(t, method, path, body)
	return a.Status, a.Body
}

// newAppStub starts a stand-in app that counts deliveries by their
// idempotency key.
func newAppStub(t *testing.T) *testkit.App {
	t.Helper()
	return testkit.NewApp(t, HeaderIdempotencyKey)
}

// newAppStubOn is newAppStub on a given loopback port.
func newAppStubOn(t *testing.T, port string) *testkit.App {
	t.Helper()
	return testkit.NewAppOn(t, port, HeaderIdempotencyKey)
}

// pingbackSite is a site block with one pingback route in front of app.
func pingbackSite(provider, handlerLines string, app *testkit.App) string {
	return fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider %s
			%s
		}
		reverse_proxy %s
	}
}
`, testHTTPPort, provider, handlerLines, app.HostPort())
}

// Child Caddy processes (built from ./cmd/caddy) listen on their own ports,
// apart from the in-process Caddy's, picked like those. At most one child
// runs on them at a time; a second child beside it takes
// testkit.UnusedLoopbackPort ports.
var (
	childAdmin    = "localhost:" + processPort()
	childHTTPPort = processPort()
	childBase     = "http://localhost:" + childHTTPPort
)

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
	return testkit.Globals{
		Admin:    childAdmin,
		HTTPPort: childHTTPPort,
		Pingback: "storage_dir " + dir + "\n" + pingbackGlobal,
	}.Caddyfile(sites)
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

// childCaddy is a Caddy process running a Caddyfile.
type childCaddy struct {
	t      *testing.T
	admin  string // admin address (host:port)
	base   string // HTTP base URL
	cmd    *exec.Cmd
	output *testkit.SyncBuffer // stdout and stderr (Caddy logs to stderr)
	exited chan struct{}       // closed once the process has been waited for
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
	bin := testkit.CaddyBinary(t)
	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &childCaddy{t: t, admin: admin, base: base, output: new(testkit.SyncBuffer), exited: make(chan struct{})}
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
	testkit.WaitFor(c.t, timeout, "the child caddy to serve", func() bool {
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
	case <-time.After(testkit.Slowdown * 20 * time.Second):
		c.t.Fatalf("child caddy did not exit within %s of /stop", testkit.Slowdown*20*time.Second)
	}
	if !c.state.Success() {
		c.t.Fatalf("child caddy exited with %v after /stop", c.state)
	}
}
