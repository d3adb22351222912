package pingback

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/store"
)

// runCLI runs `caddy pingback <args>` in-process and returns its stdout,
// stderr and error.
func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := &cobra.Command{Use: "pingback"}
	for _, build := range subcommands {
		root.AddCommand(build())
	}
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), errOut.String(), err
}

// TestCLI runs each subcommand that talks to the admin endpoint against
// an in-process Caddy, with good and bad input.
func TestCLI(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))
	if code, _ := postForm(t, testBase+"/cb", "id=501&code=A"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, "2captcha", "501", store.StateDelivered)
	app.setStatus(http.StatusServiceUnavailable)
	if code, _ := postForm(t, testBase+"/cb", "id=502&code=B"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, "2captcha", "502", store.StateParked)
	if code, _ := postForm(t, testBase+"/cb", "id=503&code=C"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, "2captcha", "503", store.StateParked)
	app.setStatus(http.StatusOK)

	// A config file naming the admin address: found as `caddy reload` finds it.
	conf := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(conf, []byte("{\n\tadmin "+testAdmin+"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "--address=" + testAdmin
	runCLICases(t, []cliCase{
		{name: "status", args: []string{"status", addr},
			out: []string{"PROVIDER", "STORED", "PARKED", "OLDEST PENDING  LAST PINGBACK", "2captcha  3       1          0       0         2", "ago", "loop replay: last run", "store: badger"}},
		{name: "status from --config", args: []string{"status", "--config", conf}, out: []string{"2captcha"}},
		{name: "status --json", args: []string{"status", addr, "--json"}, jsonOut: true, out: []string{`"parked":2`}},
		{name: "status unreachable", args: []string{"status", "--address=127.0.0.1:1"}, fail: true, errOut: []string{"127.0.0.1:1"}},
		{name: "status unreachable --json", args: []string{"status", "--address=127.0.0.1:1", "--json"}, fail: true, jsonErr: true, errOut: []string{`"error"`, "127.0.0.1:1"}},
		{name: "status extra argument", args: []string{"status", addr, "x"}, fail: true},
		{name: "records parked", args: []string{"records", addr, "--state", "parked"},
			out: []string{"PROVIDER", "2captcha  502  parked  2", "app answered 503"}},
		{name: "records --json", args: []string{"records", addr, "--provider", "2captcha", "--json"}, jsonOut: true, out: []string{`"id":"501"`, `"id":"502"`}},
		{name: "records bad state", args: []string{"records", addr, "--state", "lost"}, fail: true, errOut: []string{"unknown state", "400"}},
		{name: "records bad limit", args: []string{"records", addr, "--limit", "0"}, fail: true, errOut: []string{"limit"}},
		{name: "show", args: []string{"show", addr, "2captcha", "502"}, out: []string{"key:", "2captcha:502", "state:", "parked", "last status:", "503",
			"history:", "ATTEMPT  SOURCE    STARTED", "  1        callback  ", "  2        replay    ", "503     failed   app answered 503"}},
		{name: "show --json history", args: []string{"show", addr, "--json", "2captcha", "502"}, jsonOut: true,
			out: []string{`"history":[{"attempt":1,"source":"callback"`, `"outcome":"failed"`}},
		{name: "show unknown", args: []string{"show", addr, "2captcha", "404"}, fail: true, errOut: []string{"no stored result 2captcha:404", "404"}},
		{name: "show unknown --json", args: []string{"show", addr, "--json", "2captcha", "404"}, fail: true, jsonErr: true, errOut: []string{"no stored result"}},
		{name: "show one argument", args: []string{"show", addr, "2captcha"}, fail: true},
		{name: "replay delivered", args: []string{"replay", addr, "2captcha", "501"}, fail: true, errOut: []string{"force", "409"}},
		{name: "replay parked", args: []string{"replay", addr, "2captcha", "502"}, out: []string{"state:", "delivered", "attempts:", "3"}},
		{name: "show after a replay by hand", args: []string{"show", addr, "2captcha", "502"}, out: []string{"  3        manual    ", "200     delivered  -"}},
		{name: "replay --force", args: []string{"replay", addr, "--force", "--json", "2captcha", "501"}, jsonOut: true, out: []string{`"state":"delivered"`, `"attempts":2`}},
		{name: "replay unknown", args: []string{"replay", addr, "2captcha", "404"}, fail: true, errOut: []string{"404"}},
		{name: "replay --state parked", args: []string{"replay", addr, "--state", "parked", "--provider", "2captcha", "--since", "1h"},
			out: []string{"done, 1/1 done, 1 delivered, 0 failed"}},
		{name: "show after a bulk replay", args: []string{"show", addr, "2captcha", "503"}, out: []string{"  3        bulk      ", "delivered"}},
		{name: "replay --state --json", args: []string{"replay", addr, "--state", "parked", "--json"}, jsonOut: true, out: []string{`"status":"done"`, `"matched":0`}},
		{name: "replay --state with an id", args: []string{"replay", addr, "--state", "parked", "2captcha", "503"}, fail: true},
		{name: "replay --state bad", args: []string{"replay", addr, "--state", "delivered"}, fail: true, errOut: []string{"cannot be replayed in bulk", "400"}},
		{name: "tasks", args: []string{"tasks", addr}, out: []string{"PROVIDER  ID", "RESULT AT"}},
		{name: "tasks --json", args: []string{"tasks", addr, "--state", "pending", "--json"}, jsonOut: true, out: []string{`"tasks":[]`}},
		{name: "tasks bad state", args: []string{"tasks", addr, "--state", "stopped"}, fail: true, errOut: []string{"unknown task state", "400"}},
		{name: "replay --since bad", args: []string{"replay", addr, "--state", "parked", "--since", "last week"}, fail: true, errOut: []string{"--since"}},
	})
}

// cliCase is one run of `caddy pingback` and what it must print.
type cliCase struct {
	name    string
	args    []string
	fail    bool
	out     []string // substrings of stdout
	notOut  []string // not in stdout
	errOut  []string // substrings of stderr
	jsonOut bool     // stdout is JSON
	jsonErr bool     // stderr is JSON
	lines   int      // lines of stdout, if set
}

// runCLICases runs each case as a subtest, in order.
func runCLICases(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := runCLI(t, tc.args...)
			if (err != nil) != tc.fail {
				t.Fatalf("error %v, want failure %v\nstdout: %s\nstderr: %s", err, tc.fail, out, errOut)
			}
			if tc.fail && errOut == "" {
				t.Errorf("failed without a word on stderr")
			}
			for _, s := range tc.out {
				if !strings.Contains(out, s) {
					t.Errorf("stdout lacks %q:\n%s", s, out)
				}
			}
			for _, s := range tc.notOut {
				if strings.Contains(out, s) {
					t.Errorf("stdout has %q:\n%s", s, out)
				}
			}
			for _, s := range tc.errOut {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr lacks %q:\n%s", s, errOut)
				}
			}
			if tc.jsonOut && !json.Valid([]byte(out)) {
				t.Errorf("stdout is not JSON:\n%s", out)
			}
			if tc.jsonErr && !json.Valid([]byte(errOut)) {
				t.Errorf("stderr is not JSON:\n%s", errOut)
			}
			if tc.lines > 0 && strings.Count(out, "\n") != tc.lines {
				t.Errorf("stdout has %d lines, want %d:\n%s", strings.Count(out, "\n"), tc.lines, out)
			}
		})
	}
}
