package pingback

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestAdminAnswersHideToken: no admin answer shows a task's pingback
// token, neither inside a stored record's request URI (list, one record,
// a replay's and a release's answer show pingback_token=[redacted]) nor in
// the task's JSON (one task, the list, a registration of a tracked task);
// the app is sent the URL without it, as before.
func TestAdminAnswersHideToken(t *testing.T) {
	app, p := startVfy(t, "", nil)
	pb, id := vfySubmit(t, p)
	tok, n := protocol.QueryToken(strings.TrimPrefix(pb, trkCallbackURL+"?"))
	if n != 1 || !protocol.ValidToken(tok) {
		t.Fatalf("pingback URL %q carries no token", pb)
	}
	vfyPingback(t, pathOf(t, pb), id, "REAL")
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
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
	status, body := adminDo(t, http.MethodGet, "/pingback/records", "")
	check("GET /pingback/records", status, http.StatusOK, body, true)
	status, body = adminDo(t, http.MethodGet, "/pingback/records?state=quarantined", "")
	check("GET /pingback/records?state=quarantined", status, http.StatusOK, body, true)
	status, body = adminDo(t, http.MethodGet, "/pingback/records/2captcha/"+id, "")
	check("GET one record", status, http.StatusOK, body, true)
	status, body = adminDo(t, http.MethodPost, "/pingback/records/2captcha/"+id+"/replay?force=true", "")
	check("POST replay", status, http.StatusOK, body, true)
	status, body = adminDo(t, http.MethodPost, "/pingback/records/2captcha/999/release", "")
	check("POST release", status, http.StatusOK, body, true)
	if !strings.Contains(string(body), `/cb?a=1\u0026`+redacted) {
		t.Errorf("release answer's URI: %s; want the other fields kept", body)
	}
	status, body = adminDo(t, http.MethodGet, "/pingback/tasks/2captcha/"+id, "")
	check("GET one task", status, http.StatusOK, body, false)
	status, body = adminDo(t, http.MethodGet, "/pingback/tasks", "")
	check("GET /pingback/tasks", status, http.StatusOK, body, false)
	status, body = adminDo(t, http.MethodPost, "/pingback/tasks", `{"provider":"2captcha","id":"`+id+`","pingback_url":"`+trkCallbackURL+`"}`)
	check("POST /pingback/tasks of a tracked task", status, http.StatusOK, body, false)

	// The app got each forward without the token.
	for _, r := range app.Requests() {
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

// TestStoredHeadersAndAdminRedaction sends a pingback carrying credential
// headers through a real Caddy: the app gets every header live; the store
// keeps only the allowlist plus keep_headers; the admin API's answers
// (list, one record, replay) never show a credential's value, even one
// kept by keep_headers; and a replay carries the kept headers.
func TestStoredHeadersAndAdminRedaction(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "keep_headers x-api-key X-Tenant", app))

	secrets := map[string]string{
		"Authorization":       "Bearer sekret-authorization-1",
		"Proxy-Authorization": "Basic sekret-proxy-2",
		"Cookie":              "session=sekret-cookie-3",
		"X-Api-Key":           "sekret-apikey-4",
		"X-Session-Token":     "sekret-session-5",
	}
	req, _ := http.NewRequest(http.MethodPost, testBase+"/cb", strings.NewReader("id=4242&code=TOKEN-4242"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("User-Agent", "2captcha-pingback/1.0")
	req.Header.Set("X-Tenant", "tenant-7")
	for k, v := range secrets {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("pingback answered %d", resp.StatusCode)
	}
	testkit.WaitFor(t, 5*time.Second, "the live delivery", func() bool { return app.Count("2captcha:4242") == 1 })
	live := app.Requests()[0]
	for k, v := range secrets {
		if k == "Proxy-Authorization" {
			continue // hop-by-hop: reverse_proxy never passes it on
		}
		if live.Header.Get(k) != v {
			t.Errorf("live delivery: %s = %q, want %q (the live forward carries every header)", k, live.Header.Get(k), v)
		}
	}

	rec := getRecord(t, "2captcha", "4242")
	for _, name := range []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Session-Token"} {
		if _, ok := rec.Request.Header[name]; ok {
			t.Errorf("stored request keeps %s; only the allowlist and keep_headers may be stored", name)
		}
	}
	for name, want := range map[string]string{"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "2captcha-pingback/1.0",
		"X-Tenant": "tenant-7", "X-Api-Key": "sekret-apikey-4"} {
		if got := rec.Request.Header.Get(name); got != want {
			t.Errorf("stored %s = %q, want %q", name, got, want)
		}
	}

	scan := func(what, body string) {
		t.Helper()
		for k, v := range secrets {
			secret := v[strings.Index(v, "sekret"):]
			if strings.Contains(body, secret) {
				t.Errorf("%s shows the %s header's value", what, k)
			}
		}
		if !strings.Contains(body, "tenant-7") || !strings.Contains(body, redactedValue) {
			t.Errorf("%s: want the kept X-Tenant value and %q for X-Api-Key; got %s", what, redactedValue, body)
		}
	}
	for _, path := range []string{"/pingback/records", "/pingback/records?provider=2captcha", "/pingback/records/2captcha/4242"} {
		status, body := adminDo(t, http.MethodGet, path, "")
		if status != 200 {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		scan("GET "+path, string(body))
	}
	status, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/4242/replay?force=true", "")
	if status != 200 {
		t.Fatalf("replay: %d %s", status, body)
	}
	scan("the replay's answer", string(body))
	reqs := app.Requests()
	replayed := reqs[len(reqs)-1]
	if replayed.Header.Get("X-Api-Key") != "sekret-apikey-4" || replayed.Header.Get("X-Tenant") != "tenant-7" {
		t.Errorf("replay lacks the kept headers: %v", replayed.Header)
	}
	if replayed.Header.Get("Authorization") != "" || replayed.Header.Get("Cookie") != "" {
		t.Errorf("replay carries a header that was not stored: %v", replayed.Header)
	}
}

// TestCredentialHeaders pins which header names admin answers redact.
func TestCredentialHeaders(t *testing.T) {
	for name, want := range map[string]bool{
		"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "Set-Cookie": true, "X-Api-Key": true,
		"Api-Key": true, "X-Auth-Token": true, "X-Client-Secret": true, "X-Session-Id": true, "X-Hub-Signature-256": true,
		"X-Apikey": true, "X-Amz-Security-Token": true, "X-Password": true, "X-Csrf-Token": true,
		"Content-Type": false, "User-Agent": false, "Idempotency-Key": false, "X-Forwarded-For": false, "X-Tenant": false,
		"Accept": false,
	} {
		if got := isCredentialHeader(name); got != want {
			t.Errorf("isCredentialHeader(%q) = %v, want %v", name, got, want)
		}
	}
	h := http.Header{"Authorization": {"Bearer x"}, "X-Tenant": {"t"}, "Cookie": {"a=1", "b=2"}}
	red := redactHeader(h)
	if red.Get("Authorization") != redactedValue || len(red["Cookie"]) != 2 || red["Cookie"][1] != redactedValue || red.Get("X-Tenant") != "t" {
		t.Errorf("redactHeader = %v", red)
	}
	if h.Get("Authorization") != "Bearer x" {
		t.Error("redactHeader changed its argument")
	}
}
