package pingback

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestReplayFollowsThePortAfterServersAreRenamed checks that a result is
// replayed through the server that received it even when a config change
// gives that server's generated name (srv0, srv1, ...) to another site: a
// new site written first takes srv0, and its own pingback route and app
// must not receive the old result.
func TestReplayFollowsThePortAfterServersAreRenamed(t *testing.T) {
	app := newAppStub(t)
	app.SetStatus(http.StatusServiceUnavailable)
	other := newAppStub(t)
	global := "replay {\n\t\t\tbackoff 100ms 200ms\n\t\t}"
	startCaddy(t, global, pingbackSite("2captcha", "", app))
	if status, body := testkit.PostForm(t, testBase+"/cb", "id=501&code=T"); status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback: %d %q", status, body)
	}
	rec := getRecord(t, "2captcha", "501")
	if rec.Server != "srv0" || !strings.HasSuffix(rec.Request.LocalAddr, ":"+testHTTPPort) {
		t.Fatalf("stored server %q local address %q, want srv0 on port %s", rec.Server, rec.Request.LocalAddr, testHTTPPort)
	}

	// The same storage_dir, a new site first: it becomes srv0.
	otherSite := strings.Replace(pingbackSite("2captcha", "", other), "localhost:"+testHTTPPort, "localhost:"+testkit.UnusedLoopbackPort(t), 1)
	loadCaddyfile(t, caddyfileFor("storage_dir "+runningApp(t).dir+"\n"+global, otherSite+pingbackSite("2captcha", "", app)))
	app.SetStatus(http.StatusOK)

	testkit.WaitFor(t, 10*time.Second, "the replay to be delivered", func() bool {
		return getRecord(t, "2captcha", "501").State == store.StateDelivered
	})
	if n := other.Count("2captcha:501"); n != 0 {
		t.Errorf("the new site's app got the result %d times, want 0", n)
	}
	reqs := app.Requests()
	if last := reqs[len(reqs)-1]; last.Header.Get(HeaderSource) != "replay" || last.Header.Get(HeaderIdempotencyKey) != "2captcha:501" {
		t.Errorf("app's last request %+v, want the replay of 2captcha:501", last)
	}
}
