package pingback

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/caddy-pingback/pingback/internal/store"
)

// reloadCaddyfile is the config of TestReloadUnderTraffic: the test globals
// plus a log file and a grace period, and a pingback route whose
// ack_timeout differs per generation so that every load is a real change.
func reloadCaddyfile(dir, logFile string, generation int, app *appStub) string {
	return fmt.Sprintf(`{
	admin %s
	http_port %s
	https_port 9443
	grace_period 5s
	auto_https off
	skip_install_trust
	persist_config off
	log {
		output file %s
		format json
		level DEBUG
	}
	pingback {
		storage_dir %s
		replay {
			backoff 50ms 200ms
		}
	}
}
%s`, testAdmin, testHTTPPort, logFile, dir,
		pingbackSite("captchaai", fmt.Sprintf("ack_timeout %dms", 2000+generation), app))
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
// admin endpoint, which answers once the new config runs.
func postLoad(t *testing.T, cfg []byte) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Post("http://"+testAdmin+"/load", "application/json", bytes.NewReader(cfg))
	if err != nil {
		t.Fatalf("POST /load: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /load: %d %s", resp.StatusCode, body)
	}
}

// lockInLog matches log lines about a (database) lock.
var lockInLog = regexp.MustCompile(`(?i)\block(ed|ing)?\b|another process`)

// TestReloadUnderTraffic: `caddy reload`-style config loads while
// callbacks flow lose nothing, deliver each result once, keep one store
// open across generations (never reopening it, so never hitting Badger's
// directory lock) and leave exactly one replay loop running.
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
		waitFor(t, 10*time.Second, "callbacks between reloads", func() bool { return ackedCount() >= want })

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
	t.Logf("%d callbacks acknowledged across %d reloads, %d of them in flight during a reload", len(ids), reloads, overlapping)
	if overlapping < reloads {
		t.Fatalf("only %d callbacks overlapped a reload; the test did not exercise reloads under traffic", overlapping)
	}

	// Every acknowledged result is stored and delivered; once all are
	// delivered (a final state) nothing more can reach the app, so the
	// counts below are final.
	running := runningApp(t)
	st := running.store(time.Second)
	waitFor(t, 20*time.Second, "every acknowledged result to be delivered", func() bool {
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
	for _, r := range app.requests() {
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
	bin := childCaddyBinary(t)
	app := newAppStub(t)
	dir := t.TempDir()
	caddyfile := caddyfileFor("storage_dir "+dir, pingbackSite("captchaai", "", app))
	loadCaddyfile(t, caddyfile)
	t.Cleanup(func() { unloadCaddy(t) })

	// The running config holds the store open.
	if status, body := get(t, testBase+"/cb?id=1&code=A"); status != http.StatusOK || body != "OK" {
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
	if status, body := get(t, testBase+"/cb?id=2&code=B"); status != http.StatusOK || body != "OK" {
		t.Fatalf("callback after validate: %d %q, want 200 OK", status, body)
	}
	waitFor(t, 5*time.Second, "the app to receive both callbacks", func() bool {
		return app.count("captchaai:1") == 1 && app.count("captchaai:2") == 1
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
	if n := len(app.requests()); n != 0 {
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
	startChildCaddy(t, childCaddyfile(dir, "", childPingbackSite(childApp.hostPort())))

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
	waitFor(t, 5*time.Second, "the child's app to receive the callback", func() bool { return childApp.count("captchaai:4") == 1 })
	if n := len(app.requests()); n != 0 {
		t.Errorf("the failed config's app received %d requests", n)
	}
}
