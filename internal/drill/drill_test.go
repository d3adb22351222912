package drill

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// drillOutput is a run of `caddy pingback drill --json` in a child
// process: exit status, the decoded report (or error) and stderr.
type drillOutput struct {
	code   int
	report drillReport
	errMsg string
	stdout string
	stderr string
}

// exampleConfig is the repository's example Caddyfile, which the drill
// rehearses as a user would.
const exampleConfig = "../../Caddyfile.example"

// runDrillChild runs the built caddy binary's drill on config (a path
// relative to this package) from an empty working directory, with a HOME
// of its own, and checks the drill left both untouched.
func runDrillChild(t *testing.T, config string, extra ...string) drillOutput {
	t.Helper()
	bin := testkit.CaddyBinary(t)
	abs, err := filepath.Abs(config)
	if err != nil {
		t.Fatal(err)
	}
	work, home := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	args := append([]string{"pingback", "drill", "--json", "--config", abs}, extra...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) } // the drill ends its own child
	cmd.WaitDelay = 15 * time.Second
	cmd.Dir = work
	cmd.Env = append(drillChildEnv(os.Environ()), "HOME="+home, "XDG_DATA_HOME="+filepath.Join(home, "data"),
		"XDG_CONFIG_HOME="+filepath.Join(home, "config"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	out := drillOutput{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		out.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running the drill: %v\nstderr:\n%s", err, out.stderr)
	}
	if out.code == 2 {
		var e struct {
			Error string `json:"error"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &e); err != nil || e.Error == "" {
			t.Fatalf("exit 2 without {\"error\": ...} on stdout: %q (%v)", out.stdout, err)
		}
		out.errMsg = e.Error
	} else {
		dec := json.NewDecoder(&stdout)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&out.report); err != nil {
			t.Fatalf("decoding the report: %v\nstdout:\n%s\nstderr:\n%s", err, out.stdout, out.stderr)
		}
	}
	for _, d := range []string{work, home} {
		if ents, _ := os.ReadDir(d); len(ents) > 0 {
			t.Errorf("the drill wrote into %s: %v", d, ents)
		}
	}
	return out
}

var drillScenarioIDs = []string{scDuplicate, scConcurrent, scAppDown, scApp5xx, scSlowApp, scDropped, scSigkill, scProviderOutage, scRace, scForged}

// checkDrillPassed checks a passing report: every route has its six rows,
// every polled provider its three, and those of them in tracked (a
// pingback_track in the config) a forged_pingback row too; each row
// passed with a measure.
func checkDrillPassed(t *testing.T, out drillOutput, routes, providers, tracked []string) {
	t.Helper()
	if out.code != 0 || !out.report.Passed {
		t.Fatalf("exit %d, passed %v\nstdout:\n%s\nstderr:\n%s", out.code, out.report.Passed, out.stdout, out.stderr)
	}
	rep := out.report
	if !rep.ScaledTimers || rep.Seconds <= 0 || rep.Seconds >= 120 {
		t.Errorf("scaled_timers %v, seconds %v: want scaled and under two minutes", rep.ScaledTimers, rep.Seconds)
	}
	rows := map[string]int{}
	for _, s := range rep.Scenarios {
		if !slices.Contains(drillScenarioIDs, s.ID) {
			t.Errorf("unknown scenario id %q", s.ID)
		}
		if s.Verdict != "pass" || s.Measures == "" || s.Expected == "" || s.Seen == "" || s.Seconds < 0 {
			t.Errorf("row %+v", s)
		}
		rows[s.ID+" "+s.Route]++
		rows[s.ID+" provider "+s.Provider]++
	}
	for _, r := range routes {
		for _, id := range []string{scDuplicate, scConcurrent, scAppDown, scApp5xx, scSlowApp, scSigkill} {
			if rows[id+" "+r] != 1 {
				t.Errorf("route %s: %d rows %s, want 1", r, rows[id+" "+r], id)
			}
		}
	}
	for _, p := range providers {
		for _, id := range []string{scDropped, scProviderOutage, scRace, scForged} {
			want := 1
			if id == scForged && !slices.Contains(tracked, p) {
				want = 0
			}
			if rows[id+" provider "+p] != want {
				t.Errorf("provider %s: %d rows %s, want %d", p, rows[id+" provider "+p], id, want)
			}
		}
	}
	if want := 6*len(routes) + 3*len(providers) + len(tracked); len(rep.Scenarios) != want {
		t.Errorf("%d scenarios, want %d", len(rep.Scenarios), want)
	}
	if n := strings.Count(out.stderr, "drill: ["); n != len(rep.Scenarios) {
		t.Errorf("%d progress lines on stderr for %d scenarios", n, len(rep.Scenarios))
	}
	if want := fmt.Sprintf("/%d] ", len(rep.Scenarios)); strings.Count(out.stderr, want) != len(rep.Scenarios) {
		t.Errorf("progress lines do not count %d scenarios:\n%s", len(rep.Scenarios), out.stderr)
	}
}

func TestDrillExample(t *testing.T) {
	t.Parallel()
	out := runDrillChild(t, exampleConfig)
	checkDrillPassed(t, out,
		[]string{"localhost/pingback/captchaai", "localhost/pingback/2captcha", "localhost/pingback/anticaptcha"},
		[]string{"2captcha", "anticaptcha"}, []string{"2captcha", "anticaptcha"})
}

func TestDrillTwoProvidersTwoRoutes(t *testing.T) {
	t.Parallel()
	out := runDrillChild(t, "testdata/two-providers.Caddyfile")
	checkDrillPassed(t, out,
		[]string{"pingbacks.example.com/pingback/rucaptcha", "pingbacks.example.com/pingback/capsolver/drill"},
		[]string{"rucaptcha", "capsolver"}, nil)
	if !slices.ContainsFunc(out.report.Notes, func(n string) bool { return strings.Contains(n, "store postgres replaced by a temporary Badger store") }) {
		t.Errorf("notes %q do not say the PostgreSQL store was replaced", out.report.Notes)
	}
}

func TestDrillCannotSandbox(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ config, want string }{
		{"testdata/no-route.Caddyfile", "no pingback route"},
		{"testdata/unknown-provider.json", `unknown provider "foocaptcha"`},
		{"testdata/does-not-exist.Caddyfile", "reading config"},
	} {
		t.Run(filepath.Base(tc.config), func(t *testing.T) {
			out := runDrillChild(t, tc.config)
			if out.code != 2 || !strings.Contains(out.errMsg, tc.want) {
				t.Fatalf("exit %d, error %q: want 2 and %q", out.code, out.errMsg, tc.want)
			}
		})
	}
}

func TestDrillBrokenSetups(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, config string
		extra        []string
		want         []string
	}{
		{"respond before pingback", "testdata/respond-first.Caddyfile", nil,
			[]string{"route localhost/pingback/2captcha", "never stored", "a handler before pingback answers it", "static_response"}},
		{"stand-in drops requests", "testdata/one-route.Caddyfile", []string{"--standin-drop"},
			[]string{"route localhost/pingback/captchaai", "the app accepted no delivery"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := runDrillChild(t, tc.config, tc.extra...)
			if out.code != 1 || out.report.Passed {
				t.Fatalf("exit %d, passed %v: want 1 and false\nstderr:\n%s", out.code, out.report.Passed, out.stderr)
			}
			var dup *drillResult
			for i, s := range out.report.Scenarios {
				if s.Verdict != "fail" {
					t.Errorf("scenario %s passed on a broken setup: %+v", s.ID, s)
				}
				if s.ID == scDuplicate {
					dup = &out.report.Scenarios[i]
				}
			}
			if dup == nil {
				t.Fatal("no duplicate scenario")
			}
			for _, w := range tc.want {
				if !strings.Contains(dup.Seen, w) {
					t.Errorf("duplicate's seen %q lacks %q", dup.Seen, w)
				}
			}
		})
	}
}

// With --app the app's own upstream gets every delivery, each with
// X-Pingback-Drill: 1, and the drill still injects its faults in front of it.
func TestDrillRealApp(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got, unmarked int
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		got++
		if r.Header.Get("X-Pingback-Drill") != "1" || r.Header.Get(drillUpstreamHeader) != "" {
			unmarked++
		}
		_, _ = io.WriteString(w, "ok")
	}))
	defer app.Close()
	cfg := filepath.Join(t.TempDir(), "Caddyfile")
	body := "http://localhost:8080 {\n\thandle /pingback/captchaai {\n\t\tpingback {\n\t\t\tprovider captchaai\n\t\t}\n\t\treverse_proxy " +
		strings.TrimPrefix(app.URL, "http://") + "\n\t}\n}\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out := runDrillChild(t, cfg, "--app")
	checkDrillPassed(t, out, []string{"localhost/pingback/captchaai"}, nil, nil)
	mu.Lock()
	defer mu.Unlock()
	// duplicate, duplicate_concurrent, 3 app_down, 3 app_5xx, slow_app, 2 sigkill
	if got != 11 || unmarked != 0 {
		t.Errorf("the app received %d deliveries (%d without X-Pingback-Drill: 1), want 11, all marked", got, unmarked)
	}
}

// drillChildren lists the running processes whose command line names a
// drill's sandbox config.
func drillChildren(t *testing.T) []string {
	t.Helper()
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte("caddy-pingback-drill-")) && bytes.Contains(b, []byte("drill.json")) {
			out = append(out, p)
		}
	}
	return out
}

// On its own timeout and on SIGINT the drill ends the sandbox Caddy and
// exits 2 saying why. Not parallel: it counts every drill child on the
// machine.
func TestDrillEndsItsProcesses(t *testing.T) {
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("needs /proc")
	}
	if left := drillChildren(t); len(left) > 0 {
		t.Fatalf("drill children running before the test: %v", left)
	}
	out := runDrillChild(t, exampleConfig, "--timeout", "4s")
	if out.code != 2 || !strings.Contains(out.errMsg, "drill stopped") {
		t.Fatalf("exit %d, error %q: want 2, drill stopped", out.code, out.errMsg)
	}
	if left := drillChildren(t); len(left) > 0 {
		t.Fatalf("after the timeout, still running: %v", left)
	}

	bin := testkit.CaddyBinary(t)
	cmd := exec.Command(bin, "pingback", "drill", "--json", "--config", exampleConfig)
	cmd.Dir = t.TempDir()
	cmd.Args[len(cmd.Args)-1], _ = filepath.Abs(exampleConfig)
	home := t.TempDir()
	cmd.Env = append(drillChildEnv(os.Environ()), "HOME="+home)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = w
	err = cmd.Start()
	_ = w.Close() // the drill holds its own copy
	if err != nil {
		t.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		defer close(lines)
		for sc := bufio.NewScanner(stderr); sc.Scan(); {
			lines <- sc.Text()
		}
	}()
	// The first scenario's progress line: the sandbox Caddy runs.
	var before []string
	deadline := time.After(time.Minute)
	for progress := false; !progress; {
		select {
		case l, ok := <-lines:
			if !ok {
				_ = cmd.Process.Kill()
				t.Fatalf("the drill's stderr ended before a progress line:\n%s", strings.Join(before, "\n"))
			}
			progress = strings.Contains(l, "drill: [1/")
			before = append(before, l)
		case <-deadline:
			_ = cmd.Process.Kill()
			t.Fatalf("no progress line within a minute:\n%s", strings.Join(before, "\n"))
		}
	}
	go func() {
		for range lines { // the rest of stderr, unread
		}
	}()
	if len(drillChildren(t)) != 1 {
		t.Errorf("sandbox Caddy not found while the drill runs")
	}
	_ = cmd.Process.Signal(os.Interrupt)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(stdout.String(), "drill stopped") {
		t.Fatalf("after SIGINT: %v, stdout %q", err, stdout.String())
	}
	if left := drillChildren(t); len(left) > 0 {
		t.Fatalf("after SIGINT, still running: %v", left)
	}
}
