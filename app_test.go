package pingback

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// Answers from https://2captcha.com/2captcha-api: Turnstile in
// challenge-page mode (a useragent beside the token) and Amazon WAF (an
// object request).
const (
	exactTurnstile = `{"status":1,"request":"0.4uMMZZdSfsVM8...610cd090","useragent":"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36"}`
	exactAmazonWAF = `{"status":1,"request":{"captcha_voucher":"eyJ0eXAiOiJKV1Qi...","existing_token":"f8ab5749-f916-..."}}`
)

// exactCaddyfile is a config with a Caddy log file, a provider block for
// provider (endpoint the test's provider, the test key) plus extra global
// lines, a pingback route /cb for provider and pingback_track for
// everything else.
func exactCaddyfile(dir, logFile, provider, endpoint, extra string, app *testkit.App) string {
	g := testGlobals(fmt.Sprintf("storage_dir %s\nprovider %s {\n\tendpoint %s\n\tapi_key %s\n}\n%s", dir, provider, endpoint, trkKey, extra))
	g.LogFile = logFile
	return g.Caddyfile(fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider %[2]s
		}
		reverse_proxy %[3]s
	}
	handle {
		pingback_track {
			provider %[2]s
		}
		reverse_proxy %[4]s
	}
}
`, testHTTPPort, provider, app.HostPort(), endpoint))
}

func startExact(t *testing.T, provider, endpoint, extra string, app *testkit.App) (logFile string) {
	t.Helper()
	dir := t.TempDir()
	logFile = filepath.Join(t.TempDir(), "caddy.log")
	loadCaddyfile(t, exactCaddyfile(dir, logFile, provider, endpoint, extra, app))
	t.Cleanup(func() {
		unloadCaddy(t)
		if t.Failed() {
			testkit.LogTail(t, logFile, 40)
		}
	})
	return logFile
}

// TestConfigErrorsAtStart: mistakes that today's main accepted and only
// met at the first poll (or never) fail when the config loads: an api_key
// placeholder that resolves empty (but `caddy validate` still passes, for a
// machine without the secret), a give_up that leaves no time for a first
// poll (with after auto, 120 s until delays are observed), globally or per
// provider.
func TestConfigErrorsAtStart(t *testing.T) {
	const unset = "PINGBACK_TEST_SURELY_UNSET_KEY"
	os.Unsetenv(unset)
	tests := []struct {
		name, global string
		validateOK   bool
		want         []string
	}{
		{"empty api_key", "provider captchaai {\n\t\t\tapi_key {env." + unset + "}\n\t\t}", true,
			[]string{"provider captchaai", "{env." + unset + "}", "empty"}},
		{"give_up under auto after", "poll {\n\t\t\tgive_up 90s\n\t\t}", false,
			[]string{"give_up (1m30s)", "first poll", "after auto: 2m0s"}},
		{"give_up equal to after", "poll {\n\t\t\tafter 30s\n\t\t\tgive_up 30s\n\t\t}", false,
			[]string{"give_up (30s)", "after 30s"}},
		{"provider give_up under auto after", "provider anticaptcha {\n\t\t\tapi_key k\n\t\t\tgive_up 1m\n\t\t}", false,
			[]string{"provider anticaptcha", "give_up (1m0s)", "first poll"}},
		{"endpoint for a provider without that API", "provider capsolver {\n\t\t\tendpoint https://x.example\n\t\t}", false,
			[]string{"provider capsolver", "endpoint", "no legacy"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cf := caddyfileFor("storage_dir "+dir+"\n\t\t"+tc.global, "")
			cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
			if err != nil {
				t.Fatalf("adapting: %v", err)
			}
			var cfg caddy.Config
			if err := caddy.StrictUnmarshalJSON(cfgJSON, &cfg); err != nil {
				t.Fatal(err)
			}
			verr := caddy.Validate(&cfg)
			if tc.validateOK != (verr == nil) {
				t.Errorf("caddy validate: %v; want ok %v", verr, tc.validateOK)
			}
			err = caddy.Load(cfgJSON, true)
			t.Cleanup(func() { unloadCaddy(t) })
			if err == nil {
				t.Fatal("config loaded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// reloadCaddyfile is the config of TestReloadUnderTraffic: the test globals
// plus a log file and a grace period, and a pingback route whose
// ack_timeout differs per generation so that every load is a real change.
func reloadCaddyfile(dir, logFile string, generation int, app *testkit.App) string {
	g := testGlobals("storage_dir " + dir + "\nreplay {\n\tbackoff 50ms 200ms\n}")
	g.GracePeriod, g.LogFile, g.LogLevel = "5s", logFile, "DEBUG"
	return g.Caddyfile(pingbackSite("captchaai", fmt.Sprintf("ack_timeout %dms", 2000+generation), app))
}

// adaptCaddyfile adapts a Caddyfile to JSON.
func adaptCaddyfile(t *testing.T, caddyfile string) []byte {
	t.Helper()
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, caddyfile)
	}
	return cfg
}

// postLoad loads a config the way `caddy reload` does: POST /load on the
// admin endpoint, which answers once the new config runs. The store of
// its storage_dir is opened self-checked (selfChecked).
func postLoad(t *testing.T, cfg []byte) {
	t.Helper()
	cfg = selfChecked(t, cfg)
	if status, body := adminDo(t, http.MethodPost, "/load", string(cfg)); status != http.StatusOK {
		t.Fatalf("POST /load: %d %s", status, body)
	}
}

// connectionDropped says whether a request failed because its connection
// was reset or closed before any answer came.
func connectionDropped(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

// lockInLog matches log lines about a (database) lock.
var lockInLog = regexp.MustCompile(`(?i)\block(ed|ing)?\b|another process`)

// TestReloadUnderTraffic: `caddy reload`-style config loads while
// callbacks flow lose nothing, deliver each result once, keep one store
// open across generations (never reopening it, so never hitting Badger's
// directory lock) and leave exactly one replay loop running.
//
// A connection dropped with no HTTP answer at all (reset, or closed before
// any response) is sent again with the same pingback, up to 3 times, and
// counted: on Linux each config binds its own SO_REUSEPORT socket, and the
// kernel resets connections still queued on the old one when it closes (a
// limit of SO_REUSEPORT in Caddy's reloads, not of this plugin; the race
// detector's slowdown widens the window). Such a sender got no 200, so
// nothing was acknowledged unstored; providers that call once lose that
// pingback to Caddy's reload and a tracked task's result is then polled.
// What the test holds this plugin to: every pingback answered is answered
// 200 "OK" and delivered once.
func TestReloadUnderTraffic(t *testing.T) {
	const workers, reloads = 4, 10
	app := newAppStub(t)
	dir := t.TempDir()
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	loadCaddyfile(t, reloadCaddyfile(dir, logFile, 0, app))
	t.Cleanup(func() { unloadCaddy(t) })

	first := runningApp(t)
	handle := first.handle
	if handle == nil {
		t.Fatal("store not open after the first load")
	}

	// Traffic: each worker sends callbacks with fresh ids back to back.
	var (
		mu       sync.Mutex
		acked    []string
		failures []string
		spans    [][2]time.Time // when each acknowledged callback was sent and answered
		dropped  int            // connections reset or closed with no answer, and sent again
		windows  [][2]time.Time // when each reload started and was applied
	)
	ackedCount := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(acked)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			client := &http.Client{Timeout: 10 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("%d%07d", w+1, i)
				sent := time.Now()
				status, body, err := getWith(client, testBase+"/cb?id="+id+"&code=TOKEN-"+id)
				for try := 0; status == 0 && connectionDropped(err) && try < 3; try++ {
					// No answer at all: the same pingback again (see above).
					mu.Lock()
					dropped++
					mu.Unlock()
					status, body, err = getWith(client, testBase+"/cb?id="+id+"&code=TOKEN-"+id)
				}
				mu.Lock()
				if err == nil && status == http.StatusOK && body == "OK" {
					acked = append(acked, id)
					spans = append(spans, [2]time.Time{sent, time.Now()})
				} else {
					failures = append(failures, fmt.Sprintf("id %s: %d %q %v", id, status, body, err))
				}
				mu.Unlock()
			}
		})
	}
	stopTraffic := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopTraffic) // before the unload above, if a check fails early

	prev := first
	for gen := 1; gen <= reloads; gen++ {
		// Let callbacks flow between reloads too.
		want := ackedCount() + 2*workers
		testkit.WaitFor(t, 10*time.Second, "callbacks between reloads", func() bool { return ackedCount() >= want })

		cfg := adaptCaddyfile(t, reloadCaddyfile(dir, logFile, gen, app))
		began := time.Now()
		postLoad(t, cfg)
		mu.Lock()
		windows = append(windows, [2]time.Time{began, time.Now()})
		mu.Unlock()

		cur := runningApp(t)
		if cur == prev {
			t.Fatalf("reload %d: the running pingback app did not change", gen)
		}
		if cur.handle != handle {
			t.Fatalf("reload %d: the store was opened again instead of shared", gen)
		}
		select {
		case <-prev.loopDone:
		default:
			t.Fatalf("reload %d: the previous config's replay loop still runs", gen)
		}
		handle.mu.Lock()
		users := len(handle.apps)
		handle.mu.Unlock()
		if users != 1 || !handle.owns(cur) {
			t.Fatalf("reload %d: %d started apps on the store (owner is newest: %v), want the new one only", gen, users, handle.owns(cur))
		}
		prev = cur
	}
	stopTraffic()

	mu.Lock()
	ids, failed := append([]string(nil), acked...), failures
	overlapping := 0 // callbacks in flight while a reload ran
	for _, sp := range spans {
		for _, win := range windows {
			if sp[0].Before(win[1]) && win[0].Before(sp[1]) {
				overlapping++
				break
			}
		}
	}
	mu.Unlock()
	if len(failed) > 0 {
		t.Errorf("%d callbacks not acknowledged with 200 OK during reloads: %v", len(failed), failed)
	}
	t.Logf("%d callbacks acknowledged across %d reloads, %d of them in flight during a reload; %d connections dropped with no answer and sent again",
		len(ids), reloads, overlapping, dropped)
	if overlapping < reloads {
		t.Fatalf("only %d callbacks overlapped a reload; the test did not exercise reloads under traffic", overlapping)
	}

	// Every acknowledged result is stored and delivered; once all are
	// delivered (a final state) nothing more can reach the app, so the
	// counts below are final.
	running := runningApp(t)
	st := running.store(time.Second)
	testkit.WaitFor(t, 20*time.Second, "every acknowledged result to be delivered", func() bool {
		for _, id := range ids {
			rec, err := st.Get(t.Context(), store.Key{Provider: "captchaai", ID: id})
			if err != nil {
				t.Fatalf("acknowledged result %s not in the store: %v", id, err)
			}
			if rec.State != store.StateDelivered {
				return false
			}
		}
		return true
	})
	counts := map[string]int{}
	for _, r := range app.Requests() {
		counts[r.Header.Get(HeaderIdempotencyKey)]++
	}
	for _, id := range ids {
		if c := counts["captchaai:"+id]; c != 1 {
			t.Errorf("app received %s %d times, want exactly once", id, c)
		}
	}

	// One store, one reference (the running config), one loop owner.
	refs, ok := stores.References(running.dir)
	if !ok || refs != 1 {
		t.Errorf("store references after reloads: %d (exists %v), want 1", refs, ok)
	}
	if !handle.owns(running) {
		t.Error("the running config does not own the replay loop")
	}

	// Caddy's log: no lock error, no error from the plugin or Badger.
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatalf("reading Caddy's log: %v", err)
	}
	if !bytes.Contains(logs, []byte("pingback store ready")) {
		t.Fatalf("the log file did not capture the plugin's logs:\n%s", logs)
	}
	sc := bufio.NewScanner(bytes.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var entry struct {
			Level  string `json:"level"`
			Logger string `json:"logger"`
		}
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line is not JSON: %v: %s", err, line)
			continue
		}
		if lockInLog.MatchString(line) {
			t.Errorf("lock message in Caddy's log: %s", line)
		}
		if strings.Contains(entry.Logger, "pingback") && entry.Level != "debug" && entry.Level != "info" {
			t.Errorf("plugin logged at %s: %s", entry.Level, line)
		}
	}
}

// TestValidateWhileSameConfigRuns: `caddy validate` in another process
// succeeds on the Caddyfile of a running config with the same storage_dir,
// because provisioning does not take the database's directory lock.
func TestValidateWhileSameConfigRuns(t *testing.T) {
	bin := testkit.CaddyBinary(t)
	app := newAppStub(t)
	dir := t.TempDir()
	caddyfile := caddyfileFor("storage_dir "+dir, pingbackSite("captchaai", "", app))
	loadCaddyfile(t, caddyfile)
	t.Cleanup(func() { unloadCaddy(t) })

	// The running config holds the store open.
	if status, body := testkit.Get(t, testBase+"/cb?id=1&code=A"); status != http.StatusOK || body != "OK" {
		t.Fatalf("callback: %d %q, want 200 OK", status, body)
	}
	if refs, _ := stores.References(runningApp(t).dir); refs != 1 {
		t.Fatalf("store references: %d, want 1 (the running config)", refs)
	}

	file := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(file, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "validate", "--config", file, "--adapter", "caddyfile")
	cmd.Env = childEnv(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("caddy validate failed while the config runs: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("Valid configuration")) {
		t.Errorf("caddy validate output lacks %q:\n%s", "Valid configuration", out)
	}

	// The running config was not disturbed.
	if status, body := testkit.Get(t, testBase+"/cb?id=2&code=B"); status != http.StatusOK || body != "OK" {
		t.Fatalf("callback after validate: %d %q, want 200 OK", status, body)
	}
	testkit.WaitFor(t, 5*time.Second, "the app to receive both callbacks", func() bool {
		return app.Count("captchaai:1") == 1 && app.Count("captchaai:2") == 1
	})
}

// TestStorageDirThatCannotBeOpened: a storage_dir that cannot be created
// fails the config load with a message naming the directory; Caddy does not
// run without persistence.
func TestStorageDirThatCannotBeOpened(t *testing.T) {
	tmp := t.TempDir()
	file := filepath.Join(tmp, "a-file")
	if err := os.WriteFile(file, []byte("in the way"), 0o600); err != nil {
		t.Fatal(err)
	}
	app := newAppStub(t)
	tests := []struct {
		name string
		dir  string
	}{
		{"storage_dir is a regular file", file},
		{"storage_dir is under a regular file", filepath.Join(file, "pingback")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := adaptCaddyfile(t, caddyfileFor("storage_dir "+tt.dir, pingbackSite("captchaai", "", app)))
			err := caddy.Load(cfg, false)
			if err == nil {
				unloadCaddy(t)
				t.Fatalf("config with storage_dir %s loaded; want an error", tt.dir)
			}
			if !strings.Contains(err.Error(), tt.dir) {
				t.Errorf("error does not name the storage_dir %s: %v", tt.dir, err)
			}
			if !strings.Contains(err.Error(), "pingback storage") {
				t.Errorf("error does not say it is the pingback storage: %v", err)
			}
			// Nothing serves callbacks without persistence.
			client := &http.Client{Timeout: 2 * time.Second}
			if _, _, err := getWith(client, testBase+"/cb?id=3&code=C"); err == nil {
				t.Error("the HTTP server answers although the config failed to load")
			}
		})
	}
	if n := len(app.Requests()); n != 0 {
		t.Errorf("the app received %d requests, want none", n)
	}
}

// TestStorageDirLockedByAnotherProcess: while a child Caddy holds a
// storage_dir, a config on the same directory in this process fails to
// start with the "locked by another process" message; the child keeps
// serving.
func TestStorageDirLockedByAnotherProcess(t *testing.T) {
	dir := t.TempDir()
	childApp := newAppStub(t)
	startChildCaddy(t, childCaddyfile(dir, "", childPingbackSite(childApp.HostPort())))

	app := newAppStub(t)
	cfg := adaptCaddyfile(t, caddyfileFor("storage_dir "+dir, pingbackSite("captchaai", "", app)))
	start := time.Now()
	err := caddy.Load(cfg, false)
	if err == nil {
		unloadCaddy(t)
		t.Fatal("a second process opened a storage_dir held by a running Caddy")
	}
	t.Logf("load failed after %s: %v", time.Since(start).Round(time.Millisecond), err)
	for _, want := range []string{"locked by another process", dir, "caddy reload"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}

	// The child still owns the directory and serves.
	client := &http.Client{Timeout: 5 * time.Second}
	status, body, err := getWith(client, childBase+"/cb?id=4&code=D")
	if err != nil || status != http.StatusOK || body != "OK" {
		t.Fatalf("callback to the child: %d %q %v, want 200 OK", status, body, err)
	}
	testkit.WaitFor(t, 5*time.Second, "the child's app to receive the callback", func() bool { return childApp.Count("captchaai:4") == 1 })
	if n := len(app.Requests()); n != 0 {
		t.Errorf("the failed config's app received %d requests", n)
	}
}

// TestStartupLine checks the start-up line: store and location, polled
// providers, and the replay and poll settings in force.
func TestStartupLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  StoreModule
		kind string
	}{
		{"badger", &BadgerStore{}, "badger"},
		{"postgres", &PostgresStore{}, "postgres"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			a := &App{
				Providers: map[string]*ProviderConfig{
					"2captcha":    {accounts: []account{{id: accountID("2captcha", "k"), key: "k", configured: "{env.TWOCAPTCHA_KEY}"}, {id: accountID("2captcha", "k3"), key: "k3", configured: "api_key #2"}}},
					"capsolver":   {},
					"anticaptcha": {accounts: []account{{id: accountID("anticaptcha", "k2"), key: "k2", configured: "api_key #1"}}},
				},
				Replay: &ReplayConfig{BackoffMin: caddy.Duration(time.Second), BackoffMax: caddy.Duration(30 * time.Second),
					MaxAttempts: 20, Concurrency: 4, ForwardTimeout: caddy.Duration(10 * time.Second)},
				Poll:     &PollConfig{After: caddy.Duration(20 * time.Second), Interval: caddy.Duration(5 * time.Second), GiveUp: caddy.Duration(10 * time.Minute), Batch: 100, Rate: 10},
				storeMod: tc.mod, name: "/data/pingback",
				logger: zap.New(core),
			}
			a.logPlan()
			got := logs.FilterMessage("pingback plugin started").All()
			if len(got) != 1 {
				t.Fatalf("start-up lines: %v", logs.All())
			}
			f := got[0].ContextMap()
			want := map[string]any{
				"store": tc.kind, "location": "/data/pingback", "replay_backoff": "1s to 30s",
				"replay_max_attempts": int64(20), "replay_concurrency": int64(4), "forward_timeout": 10 * time.Second,
				"poll": "after 20s", "poll_interval": 5 * time.Second, "poll_give_up": 10 * time.Minute,
			}
			for k, v := range want {
				if f[k] != v {
					t.Errorf("%s = %#v, want %#v", k, f[k], v)
				}
			}
			if p, ok := f["providers_polled"].([]any); !ok || len(p) != 2 || p[0] != "2captcha" || p[1] != "anticaptcha" {
				t.Errorf("providers_polled = %#v, want [2captcha anticaptcha]", f["providers_polled"])
			}
			// Each account's id next to its api_key entry, never the key.
			wantAccounts := []string{
				"2captcha " + accountID("2captcha", "k") + " {env.TWOCAPTCHA_KEY}",
				"2captcha " + accountID("2captcha", "k3") + " api_key #2",
				"anticaptcha " + accountID("anticaptcha", "k2") + " api_key #1",
			}
			slices.Sort(wantAccounts)
			if got := fmt.Sprint(f["accounts"]); got != fmt.Sprint(wantAccounts) {
				t.Errorf("accounts = %s, want %s", got, wantAccounts)
			}
		})
	}
}

// TestStartRefusesSharedStorageDir checks that Caddy does not start the
// plugin on a storage_dir that holds a file that is not the store's: the
// config load fails with an error naming the file, and the file and the
// directory's mode stay as they were.
func TestStartRefusesSharedStorageDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "app.sqlite"), []byte("the app's data"), 0o644); err != nil {
		t.Fatal(err)
	}
	app := newAppStub(t)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileFor("storage_dir "+dir, pingbackSite("2captcha", "", app))), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = caddy.Load(cfg, true)
	t.Cleanup(func() { unloadCaddy(t) })
	if err == nil || !strings.Contains(err.Error(), `"app.sqlite"`) || !strings.Contains(err.Error(), "not one of the store's files") {
		t.Fatalf("load with a shared storage_dir: %v; want an error naming app.sqlite", err)
	}
	if info, _ := os.Stat(dir); info.Mode().Perm() != 0o755 {
		t.Errorf("the refused directory's mode changed to %o", info.Mode().Perm())
	}
}
