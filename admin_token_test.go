package pingback

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestAdminAnswersHideToken: no admin answer shows a task's pingback
// token, neither inside a stored record's request URI (list, one record,
// a replay's and a release's answer show pingback_token=[redacted]) nor in
// the task's JSON (one task, the list, a registration of a tracked task);
// the app is sent the URL without it, as before.
func TestAdminAnswersHideToken(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	startCaddy(t, vfyGlobal(p), vfySite("", "pingback_url "+trkCallbackURL, p.URL, app))
	pb, id := vfySubmit(t, p)
	tok, n := protocol.QueryToken(strings.TrimPrefix(pb, trkCallbackURL+"?"))
	if n != 1 || !protocol.ValidToken(tok) {
		t.Fatalf("pingback URL %q carries no token", pb)
	}
	vfyPingback(t, pathOf(t, pb), id, "REAL")
	waitForState(t, "2captcha", id, store.StateDelivered)
	wantDelivery(t, app, "2captcha:"+id, "REAL", "/cb", "token", "true", "callback")
	// A pingback with another task's token (a stale URL, say) for an
	// unknown id: quarantined, its URI carrying the token too.
	vfyPingback(t, "/cb?a=1&"+protocol.TokenParam+"="+tok, "999", "OTHER")

	redacted := protocol.TokenParam + "=" + redactedValue
	check := func(what string, status, wantStatus int, body []byte, wantRedacted bool) {
		t.Helper()
		if status != wantStatus {
			t.Errorf("%s: %d %s, want %d", what, status, body, wantStatus)
		}
		if strings.Contains(string(body), tok) {
			t.Errorf("%s shows the pingback token: %s", what, body)
		}
		if wantRedacted && !strings.Contains(string(body), redacted) {
			t.Errorf("%s: no %s in %s", what, redacted, body)
		}
	}
	status, body := adminRequest(t, http.MethodGet, "/pingback/records")
	check("GET /pingback/records", status, http.StatusOK, body, true)
	status, body = adminRequest(t, http.MethodGet, "/pingback/records?state=quarantined")
	check("GET /pingback/records?state=quarantined", status, http.StatusOK, body, true)
	status, body = adminRequest(t, http.MethodGet, "/pingback/records/2captcha/"+id)
	check("GET one record", status, http.StatusOK, body, true)
	status, body = adminRequest(t, http.MethodPost, "/pingback/records/2captcha/"+id+"/replay?force=true")
	check("POST replay", status, http.StatusOK, body, true)
	status, body = adminRequest(t, http.MethodPost, "/pingback/records/2captcha/999/release")
	check("POST release", status, http.StatusOK, body, true)
	if !strings.Contains(string(body), `/cb?a=1\u0026`+redacted) {
		t.Errorf("release answer's URI: %s; want the other fields kept", body)
	}
	status, body = adminRequest(t, http.MethodGet, "/pingback/tasks/2captcha/"+id)
	check("GET one task", status, http.StatusOK, body, false)
	status, body = adminRequest(t, http.MethodGet, "/pingback/tasks")
	check("GET /pingback/tasks", status, http.StatusOK, body, false)
	status, body = adminCall(t, http.MethodPost, `{"provider":"2captcha","id":"`+id+`","pingback_url":"`+trkCallbackURL+`"}`)
	check("POST /pingback/tasks of a tracked task", status, http.StatusOK, body, false)

	// The app got each forward without the token.
	for _, r := range app.requests() {
		if strings.Contains(r.URI, protocol.TokenParam) {
			t.Errorf("the app was sent %s", r.URI)
		}
	}
	// What the store keeps is unchanged: the token stays where a replay
	// strips it.
	if rec := getRecord(t, "2captcha", id); rec.Request.URI != pathOf(t, pb) {
		t.Errorf("stored URI %q, want %q", rec.Request.URI, pathOf(t, pb))
	}
}
