package pingback

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// runCLI runs `caddy pingback <args>` in-process and returns its stdout,
// stderr and error.
func runCLI(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	root := &cobra.Command{Use: "pingback"}
	root.AddCommand(pingbackCommands()...)
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
	startCaddyBadger(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))
	if code, _ := testkit.PostForm(t, testBase+"/cb", "id=501&code=A"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, 5*time.Second, "2captcha", "501", store.StateDelivered)
	app.SetStatus(http.StatusServiceUnavailable)
	if code, _ := testkit.PostForm(t, testBase+"/cb", "id=502&code=B"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, 5*time.Second, "2captcha", "502", store.StateParked)
	if code, _ := testkit.PostForm(t, testBase+"/cb", "id=503&code=C"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, 5*time.Second, "2captcha", "503", store.StateParked)
	app.SetStatus(http.StatusOK)

	// A config file naming the admin address: found as `caddy reload` finds it.
	conf := filepath.Join(t.TempDir(), "Caddyfile")
	if err := os.WriteFile(conf, []byte("{\n\tadmin "+testAdmin+"\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "--address=" + testAdmin
	runCLICases(t, []cliCase{
		{name: "status", args: []string{"status", addr},
			out: []string{"PROVIDER", "STORED", "PARKED", "UNPOLLABLE  OLDEST PENDING  LAST PINGBACK", "2captcha  3       1          0       0         2", "ago", "loop replay: last run", "store: badger"}},
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
		{name: "tasks", args: []string{"tasks", addr}, out: []string{"PROVIDER  ID", "ACCOUNT", "RESULT AT"}},
		{name: "tasks bad account", args: []string{"tasks", addr, "--account", "not-an-id"}, fail: true, errOut: []string{"account must be an account id", "400"}},
		{name: "tasks --json", args: []string{"tasks", addr, "--state", "pending", "--json"}, jsonOut: true, out: []string{`"tasks":[]`}},
		{name: "tasks bad state", args: []string{"tasks", addr, "--state", "stopped"}, fail: true, errOut: []string{"unknown task state", "400"}},
		{name: "replay --since bad", args: []string{"replay", addr, "--state", "parked", "--since", "last week"}, fail: true, errOut: []string{"--since"}},
	})
}

// TestCLIPurgeAndPaging runs `caddy pingback purge` (one result, by
// filter) and the paging of `records` and `tasks` against an in-process
// Caddy, with good and bad input.
func TestCLIPurgeAndPaging(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))
	for i := range 12 {
		if code, _ := testkit.PostForm(t, testBase+"/cb", fmt.Sprintf("id=%d&code=C", 700+i)); code != http.StatusOK {
			t.Fatal("pingback refused")
		}
	}
	parkWhileAppDown(t, app, "P", "801", "802")
	waitForState(t, 5*time.Second, "2captcha", "711", store.StateDelivered)
	addr := "--address=" + testAdmin
	runCLICases(t, []cliCase{
		{name: "records pages through", args: []string{"records", addr, "--limit", "1000"}, lines: 15, out: []string{"2captcha  700", "2captcha  802"}},
		{name: "records --limit", args: []string{"records", addr, "--limit", "3"}, lines: 5, out: []string{"(more than 3"}},
		{name: "records --since", args: []string{"records", addr, "--since", "1h", "--state", "parked"}, lines: 3, out: []string{"801", "802"}},
		{name: "records --since future", args: []string{"records", addr, "--since", "2999-01-01T00:00:00Z"}, lines: 1},
		{name: "records --since bad", args: []string{"records", addr, "--since", "yesterday"}, fail: true, errOut: []string{"--since"}},
		{name: "records --json pages", args: []string{"records", addr, "--json", "--limit", "13"}, jsonOut: true, out: []string{`"next_cursor"`}},
		{name: "tasks --limit", args: []string{"tasks", addr, "--limit", "2"}, lines: 1},
		{name: "tasks bad limit", args: []string{"tasks", addr, "--limit", "0"}, fail: true, errOut: []string{"--limit"}},
		{name: "purge one", args: []string{"purge", addr, "2captcha", "700"}, out: []string{"purged 1 result\n"}},
		{name: "purge one again", args: []string{"purge", addr, "2captcha", "700"}, fail: true, errOut: []string{"already purged", "404"}},
		{name: "purge one --json", args: []string{"purge", addr, "--json", "2captcha", "701"}, jsonOut: true, out: []string{`{"purged":1}`}},
		{name: "purge unknown --json", args: []string{"purge", addr, "--json", "2captcha", "999"}, fail: true, errOut: []string{`{"error":`, "no stored result"}},
		{name: "purge --state parked", args: []string{"purge", addr, "--state", "parked", "--provider", "2captcha"}, out: []string{"purged 2 results"}},
		{name: "purge --before", args: []string{"purge", addr, "--state", "delivered", "--before", "2000-01-01T00:00:00Z"}, out: []string{"purged 0 results"}},
		{name: "purge no arguments", args: []string{"purge", addr}, fail: true},
		{name: "purge one argument", args: []string{"purge", addr, "2captcha"}, fail: true},
		{name: "purge filter and id", args: []string{"purge", addr, "--state", "parked", "2captcha", "702"}, fail: true},
		{name: "purge bad state", args: []string{"purge", addr, "--state", "lost"}, fail: true, errOut: []string{"unknown state", "400"}},
		{name: "purge bad --before", args: []string{"purge", addr, "--before", "last week"}, fail: true, errOut: []string{"--before"}},
		{name: "purge unreachable", args: []string{"purge", "--address=127.0.0.1:1", "2captcha", "702"}, fail: true, errOut: []string{"127.0.0.1:1"}},
		{name: "records after the purges", args: []string{"records", addr}, lines: 11, notOut: []string{"700", "701", "801", "802"}},
	})
	// The re-sent pingback of a purged result is not forwarded.
	before := app.Count("2captcha:700")
	if code, body := testkit.PostForm(t, testBase+"/cb", "id=700&code=C"); code != http.StatusOK || body != "OK" {
		t.Errorf("re-sent pingback: %d %q", code, body)
	}
	if n := app.Count("2captcha:700"); n != before {
		t.Errorf("the re-sent pingback of a purged result reached the app (%d, was %d)", n, before)
	}
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
