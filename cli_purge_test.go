package pingback

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestCLIPurgeAndPaging runs `caddy pingback purge` (one result, by
// filter) and the paging of `records` and `tasks` against an in-process
// Caddy, with good and bad input.
func TestCLIPurgeAndPaging(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))
	for i := range 12 {
		if code, _ := postForm(t, testBase+"/cb", fmt.Sprintf("id=%d&code=C", 700+i)); code != http.StatusOK {
			t.Fatal("pingback refused")
		}
	}
	app.setStatus(http.StatusServiceUnavailable)
	for _, id := range []string{"801", "802"} {
		if code, _ := postForm(t, testBase+"/cb", "id="+id+"&code=P"); code != http.StatusOK {
			t.Fatal("pingback refused")
		}
		waitForState(t, "2captcha", id, store.StateParked)
	}
	app.setStatus(http.StatusOK)
	waitForState(t, "2captcha", "711", store.StateDelivered)
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
	before := app.count("2captcha:700")
	if code, body := postForm(t, testBase+"/cb", "id=700&code=C"); code != http.StatusOK || body != "OK" {
		t.Errorf("re-sent pingback: %d %q", code, body)
	}
	if n := app.count("2captcha:700"); n != before {
		t.Errorf("the re-sent pingback of a purged result reached the app (%d, was %d)", n, before)
	}
}
