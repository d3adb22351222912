package pingback

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestPauseConflictsComeAfterTheRecord: while a provider is paused, a
// replay or release by hand still answers what the record is first (404
// for an unknown result, 409 "already delivered" without force, 409 "not
// quarantined" for a release of a delivered one), and 409 "paused" only
// for what a resume would let through (a forced replay).
func TestPauseConflictsComeAfterTheRecord(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, pauseGlobal, pingbackSite("2captcha", "", app))
	sendHeldPingback(t, "700")
	waitForState(t, 5*time.Second, "2captcha", "700", store.StateDelivered)
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "2captcha"}`); status != http.StatusOK {
		t.Fatalf("pause: %d %s", status, body)
	}
	for _, tc := range []struct {
		path   string
		status int
		says   string
	}{
		{"/pingback/records/2captcha/nosuch/replay", http.StatusNotFound, "no stored result"},
		{"/pingback/records/2captcha/nosuch/release", http.StatusNotFound, "no stored result"},
		{"/pingback/records/2captcha/700/replay", http.StatusConflict, "already delivered"},
		{"/pingback/records/2captcha/700/replay?force=true", http.StatusConflict, "paused"},
	} {
		status, body := adminDo(t, http.MethodPost, tc.path, "")
		if status != tc.status || !strings.Contains(string(body), tc.says) {
			t.Errorf("POST %s while paused: %d %s; want %d saying %q", tc.path, status, body, tc.status, tc.says)
		}
	}
	if rec := adminRecord(t, "2captcha", "700"); rec.State != store.StateDelivered || rec.Attempts != 1 || rec.Held {
		t.Errorf("delivered record after the refused replays: state %s, attempts %d, held %v; want delivered, 1, not held", rec.State, rec.Attempts, rec.Held)
	}
	if n := len(app.Requests()); n != 1 {
		t.Errorf("the app got %d requests, want the one live delivery", n)
	}
}
