package pingback

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// The verification tests run a real Caddy with pingback_track in front of
// a recording provider (trkProvider) and a pingback route (/cb) in front
// of a recording app, and forge pingbacks as an attacker on the network
// would: a plain POST to /cb with a guessed id.

// vfyGlobal is the global block: 2captcha's res.php is the recording
// provider, with the account's key.
func vfyGlobal(p *trkProvider) string {
	return fmt.Sprintf("provider 2captcha {\n\t\t\tendpoint %s\n\t\t\tapi_key %s\n\t\t}\n\t\tpoll {\n\t\t\tafter %s\n\t\t}", p.URL, trkKey, trkAfter)
}

// vfySite is trkSite with handler lines for the pingback handler.
func vfySite(handlerLines, trackLines, upstream string, app *testkit.App) string {
	return fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider 2captcha
			%s
		}
		reverse_proxy %s
	}
	handle {
		pingback_track {
			provider 2captcha
			%s
		}
		reverse_proxy %s
	}
}
`, testHTTPPort, handlerLines, app.HostPort(), trackLines, upstream)
}

// startVfy starts Caddy with vfyGlobal and vfySite (with handlerLines for
// the pingback handler), whose pingback_track adds the tokenised pingback
// URL, in front of a new recording provider p and app; wrap, when not nil,
// wraps the app's store.
func startVfy(t *testing.T, handlerLines string, wrap func(store.Store) store.Store) (app *testkit.App, p *trkProvider) {
	t.Helper()
	app = newAppStub(t)
	p = newTrkProvider(t)
	site := vfySite(handlerLines, "pingback_url "+trkCallbackURL, p.URL, app)
	if wrap == nil {
		startCaddy(t, vfyGlobal(p), site)
	} else {
		startCaddyWrapped(t, wrap, vfyGlobal(p), site)
	}
	return app, p
}

// vfySubmit submits a task as an app would (POST form, no pingback: the
// configured one is added) and returns the pingback URL the provider was
// given (with its token) and the task id.
func vfySubmit(t *testing.T, p *trkProvider) (pingbackURL, id string) {
	t.Helper()
	p.reset()
	resp := trkDo(t, http.MethodPost, "/in.php", "application/x-www-form-urlencoded",
		strings.NewReader("key="+trkKey+"&method=userrecaptcha&googlekey=k&pageurl=https://a.example"))
	if resp.status != http.StatusOK {
		t.Fatalf("submission: %d %s", resp.status, resp.body)
	}
	seen := p.requests("in.php")
	if len(seen) != 1 {
		t.Fatalf("provider saw %d submissions", len(seen))
	}
	id = strings.TrimPrefix(string(resp.body), "OK|")
	return seen[0].Form.Get("pingback"), id
}

// vfyPingback sends a 2captcha pingback (POST form) to target (a path
// with its query) and checks the 200.
func vfyPingback(t *testing.T, target, id, code string, header ...string) {
	t.Helper()
	resp := trkDo(t, http.MethodPost, target, "application/x-www-form-urlencoded",
		strings.NewReader(url.Values{"id": {id}, "code": {code}}.Encode()), header...)
	if resp.status != http.StatusOK || string(resp.body) != "OK" {
		t.Fatalf("pingback %s to %s: got %d %q, want 200 OK", id, target, resp.status, resp.body)
	}
}

// pathOf is the path and query of an absolute URL.
func pathOf(t *testing.T, u string) string {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return pu.RequestURI()
}

func quarantinedCount(t *testing.T) float64 {
	return testutil.ToFloat64(runningApp(t).metrics.callbacks.WithLabelValues("2captcha", "quarantined"))
}

// wantDelivery checks the app's requests for key: exactly one, with the
// given code in its body, URI and verification headers.
func wantDelivery(t *testing.T, app *testkit.App, key, code, uri, verified, tracked, source string) testkit.Received {
	t.Helper()
	var got []testkit.Received
	for _, r := range app.Requests() {
		if r.Header.Get(HeaderIdempotencyKey) == key {
			got = append(got, r)
		}
	}
	if len(got) != 1 {
		t.Fatalf("app got %d deliveries of %s, want 1: %+v", len(got), key, got)
	}
	r := got[0]
	if !strings.Contains(r.Body, "code="+url.QueryEscape(code)) || r.URI != uri {
		t.Errorf("delivery of %s: %s %q, want code %s at %s", key, r.URI, r.Body, code, uri)
	}
	for name, want := range map[string]string{HeaderVerified: verified, HeaderTracked: tracked, HeaderSource: source} {
		if g := r.Header.Get(name); g != want {
			t.Errorf("delivery of %s: %s %q, want %q", key, name, g, want)
		}
	}
	return r
}

// TestVerifyTokenForgeryBeforeReal: with the secure defaults (a
// pingback_track for the provider: verify token, unknown_ids quarantine),
// a forged pingback for a tracked task, sent before the real one, is
// answered 200, quarantined and counted, never delivered; the real one,
// carrying its token, is delivered with the token taken out of the URL,
// X-Pingback-Verified: token and X-Pingback-Tracked: true, and the forged
// code is kept beside the real one.
func TestVerifyTokenForgeryBeforeReal(t *testing.T) {
	app, p := startVfy(t, "", nil)
	pb, id := vfySubmit(t, p)
	tok, n := protocol.QueryToken(strings.TrimPrefix(pb, trkCallbackURL+"?"))
	if !strings.HasPrefix(pb, trkCallbackURL+"?") || n != 1 || !protocol.ValidToken(tok) {
		t.Fatalf("the provider was given pingback %q; want the configured URL with a token", pb)
	}
	if task, err := trkTask(t, id); err != nil || task.Token != tok || task.PingbackURL != trkCallbackURL {
		t.Fatalf("task = %+v, %v; want token %s and the URL without it", task, err, tok)
	}
	before := quarantinedCount(t)

	vfyPingback(t, "/cb", id, "FORGED")                                                   // no token
	vfyPingback(t, "/cb?"+protocol.TokenParam+"="+strings.Repeat("0", 32), id, "FORGED2") // a wrong one
	rec := getRecord(t, "2captcha", id)
	if rec.State != store.StateQuarantined || rec.Quarantine != "token_mismatch" || rec.Code != "FORGED" {
		t.Fatalf("forged pingback stored as %s (%s) code %q; want quarantined token_mismatch", rec.State, rec.Quarantine, rec.Code)
	}
	if got := quarantinedCount(t) - before; got != 2 {
		t.Errorf("callbacks{result=quarantined} rose by %v, want 2", got)
	}
	if task, _ := trkTask(t, id); task.State != store.TaskPending {
		t.Errorf("a quarantined forgery completed the task: %s", task.State)
	}
	if n := len(app.Requests()); n != 0 {
		t.Fatalf("the app got %d requests from forgeries", n)
	}
	// pingback_track's local res.php does not serve the quarantined code:
	// the app's request goes to the provider.
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte("CAPCHA_NOT_READY")})
	if r := trkDo(t, http.MethodGet, "/res.php?key="+trkKey+"&action=get&id="+id, "", nil); string(r.body) != "CAPCHA_NOT_READY" || len(p.requests("res.php")) != 1 {
		t.Errorf("res.php for a quarantined result answered %q (provider asked %d times); want the provider's answer", r.body, len(p.requests("res.php")))
	}
	// Visible in the admin API's list by state.
	code, body := adminDo(t, http.MethodGet, "/pingback/records?state=quarantined", "")
	if code != http.StatusOK || !strings.Contains(string(body), `"id":"`+id+`"`) || !strings.Contains(string(body), `"quarantine":"token_mismatch"`) {
		t.Errorf("GET records?state=quarantined = %d %s", code, body)
	}

	vfyPingback(t, pathOf(t, pb), id, "REAL")
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	wantDelivery(t, app, "2captcha:"+id, "REAL", "/cb", "token", "true", "callback")
	rec = getRecord(t, "2captcha", id)
	if rec.Code != "REAL" || rec.OtherCode != "FORGED" || rec.Verified != "token" {
		t.Errorf("record: code %q other %q verified %q; want REAL, FORGED kept, token", rec.Code, rec.OtherCode, rec.Verified)
	}
	if task, _ := trkTask(t, id); task.State != store.TaskDone {
		t.Errorf("task after the real pingback: %s, want done", task.State)
	}
	// A forgery after the real one changes nothing.
	vfyPingback(t, "/cb", id, "LATE-FORGERY")
	if rec := getRecord(t, "2captcha", id); rec.Code != "REAL" || rec.State != store.StateDelivered {
		t.Errorf("after a late forgery: %s %q", rec.State, rec.Code)
	}
	if n := len(app.Requests()); n != 1 {
		t.Errorf("app got %d requests, want the real one only", n)
	}
}

// TestVerifyInboundHeaders: X-Pingback-* headers sent by whoever calls
// the pingback route never reach the app; the plugin's own do.
func TestVerifyInboundHeaders(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	vfyPingback(t, "/cb", "601", "A", HeaderVerified, "token", HeaderTracked, "true", "X-Pingback-Anything", "x", HeaderSource, "poll")
	waitForState(t, 5*time.Second, "2captcha", "601", store.StateDelivered)
	r := wantDelivery(t, app, "2captcha:601", "A", "/cb", "none", "false", "callback")
	if r.Header.Get("X-Pingback-Anything") != "" {
		t.Errorf("an inbound X-Pingback-* header reached the app: %v", r.Header)
	}
}

// TestVerifyResPHPForgery: with verify res_php, a forged pingback is
// confirmed with one res.php request; the provider's answer differs, so
// the provider's answer is what the app gets (as the provider's own
// pingback to the task's URL, X-Pingback-Verified: res_php) and the forged
// code is kept as other_code.
func TestVerifyResPHPForgery(t *testing.T) {
	app, p := startVfy(t, "verify res_php", nil)
	_, id := vfySubmit(t, p)
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"REAL"}`)})
	vfyPingback(t, "/cb", id, "FORGED")
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	wantDelivery(t, app, "2captcha:"+id, "REAL", "/cb", "res_php", "true", "poll")
	rec := getRecord(t, "2captcha", id)
	if rec.Code != "REAL" || rec.OtherCode != "FORGED" {
		t.Errorf("record code %q other %q; want REAL and the forged code kept", rec.Code, rec.OtherCode)
	}
	if got := len(p.requests("res.php")); got != 1 {
		t.Errorf("provider got %d res.php requests, want 1", got)
	}
	// The same code confirmed: delivered as the pingback, verified.
	_, id2 := vfySubmit(t, p)
	if id2 == id {
		p.answer("in.php", trkAnswer{status: http.StatusOK, body: []byte("OK|71000000002")})
		_, id2 = vfySubmit(t, p)
	}
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"SAME"}`)})
	vfyPingback(t, "/cb", id2, "SAME")
	waitForState(t, 5*time.Second, "2captcha", id2, store.StateDelivered)
	wantDelivery(t, app, "2captcha:"+id2, "SAME", "/cb", "res_php", "true", "callback")
	wantHistorySources(t, "2captcha", id, store.SourcePoll)
	wantHistorySources(t, "2captcha", id2, store.SourceCallback)
}

// TestVerifyResPHPNotReady: a result the provider says is not ready is
// asked again 3 times (the waits injected), then quarantined as not
// confirmed, without holding the provider's request.
func TestVerifyResPHPNotReady(t *testing.T) {
	waits := make(chan time.Duration, 10)
	app, p := startVfy(t, "verify res_php", nil)
	runningApp(t).confirmWait = func(ctx context.Context, d time.Duration) bool { waits <- d; return true }
	_, id := vfySubmit(t, p)
	start := time.Now()
	vfyPingback(t, "/cb", id, "EARLY")
	if took := time.Since(start); took > time.Second {
		t.Errorf("the provider waited %s for its answer", took)
	}
	testkit.WaitFor(t, 10*time.Second, "not confirmed", func() bool {
		return getRecord(t, "2captcha", id).Quarantine == "not_confirmed"
	})
	if got := len(p.requests("res.php")); got != 4 {
		t.Errorf("res.php asked %d times, want 1 + 3", got)
	}
	if len(waits) != 3 || <-waits != 5*time.Second {
		t.Errorf("waited %d times", len(waits))
	}
	if rec := getRecord(t, "2captcha", id); rec.State != store.StateQuarantined {
		t.Errorf("state %s, want quarantined", rec.State)
	}
	if n := len(app.Requests()); n != 0 {
		t.Errorf("app got %d requests", n)
	}
}

// TestVerifyConfigErrors: verify res_php needs an api_key; bad values are
// refused with the line.
func TestVerifyConfigErrors(t *testing.T) {
	for _, tc := range []struct{ lines, want string }{
		{"verify sometimes", "invalid verify 'sometimes'"},
		{"unknown_ids maybe", "invalid unknown_ids 'maybe'"},
	} {
		site := fmt.Sprintf("http://localhost:%s {\n\tpingback {\n\t\tprovider 2captcha\n\t\t%s\n\t}\n}\n", testHTTPPort, tc.lines)
		_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileFor("", site)), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.lines, err, tc.want)
		}
	}
	h := &Handler{Provider: "2captcha", Verify: VerifyResPHP, app: &App{Poll: &PollConfig{}}}
	if err := h.provisionVerify(); err == nil || !strings.Contains(err.Error(), "api_key") {
		t.Errorf("verify res_php without api_key: %v", err)
	}
}

// TestVerifyAcceptConflictCorrection: with verify none and unknown_ids
// accept, a forged pingback for a tracked task reaches the app; the real
// one that follows conflicts, the provider is asked, its answer wins and
// the app gets it again as a correction (X-Pingback-Source: correction,
// Idempotency-Key <provider>:<id>:correction); both codes are kept.
func TestVerifyAcceptConflictCorrection(t *testing.T) {
	app, p := startVfy(t, "verify none\n\t\t\tunknown_ids accept", nil)
	pb, id := vfySubmit(t, p)
	vfyPingback(t, "/cb", id, "FORGED")
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	wantDelivery(t, app, "2captcha:"+id, "FORGED", "/cb", "none", "true", "callback")
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"REAL"}`)})
	vfyPingback(t, pathOf(t, pb), id, "REAL")
	testkit.WaitFor(t, 10*time.Second, "the correction", func() bool {
		for _, r := range app.Requests() {
			if r.Header.Get(HeaderIdempotencyKey) == "2captcha:"+id+":correction" {
				return true
			}
		}
		return false
	})
	wantDelivery(t, app, "2captcha:"+id+":correction", "REAL", "/cb", "res_php", "true", "correction")
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	rec := getRecord(t, "2captcha", id)
	if rec.Code != "REAL" || rec.OtherCode != "FORGED" || !rec.Correction {
		t.Errorf("record code %q other %q correction %v", rec.Code, rec.OtherCode, rec.Correction)
	}
	wantHistorySources(t, "2captcha", id, store.SourceCallback, store.SourceCorrection)
}

// TestVerifyUnknownIDs: a pingback for an id no submission produced, in
// each unknown_ids mode.
func TestVerifyUnknownIDs(t *testing.T) {
	for _, tc := range []struct {
		mode       string
		wantStatus int
		wantState  store.State // "" for not stored
	}{
		{"accept", http.StatusOK, store.StateDelivered},
		{"quarantine", http.StatusOK, store.StateQuarantined},
		{"reject", http.StatusNotFound, ""},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			app, _ := startVfy(t, "unknown_ids "+tc.mode, nil)
			resp := trkDo(t, http.MethodPost, "/cb", "application/x-www-form-urlencoded", strings.NewReader("id=999&code=X"))
			if resp.status != tc.wantStatus {
				t.Fatalf("answer %d %q, want %d", resp.status, resp.body, tc.wantStatus)
			}
			if tc.wantState == "" {
				trkAssertNotStored(t, "999")
				return
			}
			waitForState(t, 5*time.Second, "2captcha", "999", tc.wantState)
			if tc.wantState == store.StateDelivered {
				wantDelivery(t, app, "2captcha:999", "X", "/cb", "none", "false", "callback")
			} else if n := len(app.Requests()); n != 0 {
				t.Errorf("app got %d requests", n)
			}
		})
	}
}

// TestVerifyForgedFutureID: a forgery for an id not yet submitted (the
// next one, guessed) never completes the task submitted later, whatever
// the mode: the task stays pending and is polled.
func TestVerifyForgedFutureID(t *testing.T) {
	for _, mode := range []string{"quarantine", "accept"} {
		t.Run(mode, func(t *testing.T) {
			_, p := startVfy(t, "unknown_ids "+mode, nil)
			vfyPingback(t, "/cb", "71000000001", "FORGED-FUTURE")
			_, id := vfySubmit(t, p)
			task, err := trkTask(t, id)
			if err != nil || task.State != store.TaskPending {
				t.Fatalf("task submitted after a forged result for its id: %+v, %v; want pending", task, err)
			}
			if mode == "quarantine" {
				if rec := getRecord(t, "2captcha", id); rec.State != store.StateQuarantined || rec.Quarantine != whyBeforeSubmission {
					t.Errorf("the forgery when its task was submitted: %s %q, want quarantined %s", rec.State, rec.Quarantine, whyBeforeSubmission)
				}
			}
		})
	}
}

// TestVerifyLeadingZeros: 0123 and 123 are one task: one key, one
// delivery; the request is forwarded as it was sent.
func TestVerifyLeadingZeros(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	vfyPingback(t, "/cb", "000123", "A")
	vfyPingback(t, "/cb", "123", "A")
	waitForState(t, 5*time.Second, "2captcha", "123", store.StateDelivered)
	r := wantDelivery(t, app, "2captcha:123", "A", "/cb", "none", "false", "callback")
	if r.Body != "code=A&id=000123" {
		t.Errorf("forwarded body %q, want the request as sent", r.Body)
	}
	if code, body := adminDo(t, http.MethodGet, "/pingback/records/2captcha/0123", ""); code != http.StatusOK || !strings.Contains(string(body), `"id":"123"`) {
		t.Errorf("GET records/2captcha/0123 = %d %s", code, body)
	}
}

// TestVerifyRelease: a quarantined result is delivered by hand, through
// the admin API and through `caddy pingback release`; a replay refuses it,
// and a result that is not quarantined cannot be released.
func TestVerifyRelease(t *testing.T) {
	app, _ := startVfy(t, "", nil)
	vfyPingback(t, "/cb", "801", "A")
	vfyPingback(t, "/cb", "802", "B")
	admin := "/pingback/records/2captcha/"
	if code, body := adminDo(t, http.MethodPost, admin+"801/replay", ""); code != http.StatusConflict || !strings.Contains(string(body), "release") {
		t.Errorf("replay of a quarantined result = %d %s, want 409 naming release", code, body)
	}
	if code, body := adminDo(t, http.MethodPost, admin+"801/release", ""); code != http.StatusOK || !strings.Contains(string(body), `"state":"delivered"`) {
		t.Fatalf("release = %d %s", code, body)
	}
	wantDelivery(t, app, "2captcha:801", "A", "/cb", "none", "false", "replay")
	wantHistorySources(t, "2captcha", "801", store.SourceManual)
	if code, _ := adminDo(t, http.MethodPost, admin+"801/release", ""); code != http.StatusConflict {
		t.Errorf("second release = %d, want 409", code)
	}
	if code, _ := adminDo(t, http.MethodPost, admin+"999/release", ""); code != http.StatusNotFound {
		t.Errorf("release of an unknown result = %d, want 404", code)
	}
	out, errOut, err := runCLI(t, "release", "--address="+testAdmin, "2captcha", "802")
	if err != nil || !strings.Contains(out, "delivered") {
		t.Fatalf("caddy pingback release: %v\n%s%s", err, out, errOut)
	}
	wantDelivery(t, app, "2captcha:802", "B", "/cb", "none", "false", "replay")
	if _, _, err := runCLI(t, "release", "--address="+testAdmin, "2captcha", "802"); err == nil {
		t.Error("releasing a delivered result succeeded")
	}
}

// heldProvider answers in.php only after it has sent the pingback of the
// task it creates (with the token of the URL it was given) and seen it
// answered: the pingback reaches Caddy between the submission and the
// commit of its task.
type heldProvider struct {
	*httptest.Server
	mu     sync.Mutex
	status int // of the pingback
}

func newHeldProvider(t *testing.T, id string) *heldProvider {
	hp := &heldProvider{}
	hp.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		pb := r.Form.Get("pingback")
		resp, err := http.Post(pb, "application/x-www-form-urlencoded", strings.NewReader("id="+id+"&code=FAST"))
		hp.mu.Lock()
		if err == nil {
			hp.status = resp.StatusCode
			resp.Body.Close()
		}
		hp.mu.Unlock()
		_, _ = io.WriteString(w, "OK|"+id)
	}))
	t.Cleanup(hp.Close)
	return hp
}

// TestVerifyHeldUntilCommit: a pingback that arrives while its submission
// is in flight (before the task commits) is held, then checked against the
// task's token when the task commits and delivered; with unknown_ids
// reject it is held all the same, not rejected.
func TestVerifyHeldUntilCommit(t *testing.T) {
	for _, mode := range []string{"quarantine", "reject"} {
		t.Run(mode, func(t *testing.T) {
			app := newAppStub(t)
			hp := newHeldProvider(t, "4242")
			startCaddy(t, trkGlobal, vfySite("unknown_ids "+mode, "pingback_url "+trkCallbackURL, hp.URL, app))
			resp := trkDo(t, http.MethodPost, "/in.php", "application/x-www-form-urlencoded",
				strings.NewReader("key="+trkKey+"&method=userrecaptcha&googlekey=k&pageurl=https://a.example"))
			if resp.status != http.StatusOK {
				t.Fatalf("submission: %d", resp.status)
			}
			hp.mu.Lock()
			status := hp.status
			hp.mu.Unlock()
			if status != http.StatusOK {
				t.Fatalf("the early pingback was answered %d", status)
			}
			waitForState(t, 5*time.Second, "2captcha", "4242", store.StateDelivered)
			wantDelivery(t, app, "2captcha:4242", "FAST", "/cb", "token", "true", "callback")
			wantHistorySources(t, "2captcha", "4242", store.SourceCallback)
			if task, _ := trkTask(t, "4242"); task.State != store.TaskDone {
				t.Errorf("task after its held pingback was delivered: %s", task.State)
			}
		})
	}
}

// TestVerifyGetSubmissionWithQuery: a GET submission whose pingback URL
// already has a query is forwarded byte for byte and tracked without a
// token (2captcha keeps only the first field of such a URL); its pingback
// is then confirmed with res.php, the provider having an api_key.
func TestVerifyGetSubmissionWithQuery(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	startCaddy(t, vfyGlobal(p), vfySite("", "", p.URL, app))
	q := "key=" + trkKey + "&method=userrecaptcha&pingback=" + url.QueryEscape(trkCallbackURL+"?tenant=7") + "&json=0"
	resp := trkDo(t, http.MethodGet, "/in.php?"+q, "", nil)
	if resp.status != http.StatusOK {
		t.Fatalf("submission: %d", resp.status)
	}
	seen := p.requests("in.php")
	if len(seen) != 1 || seen[0].RawQuery != q {
		t.Fatalf("provider saw %+v, want the query byte for byte", seen)
	}
	task, err := trkTask(t, "71000000001")
	if err != nil || task.Token != "" || task.PingbackURL != trkCallbackURL+"?tenant=7" {
		t.Fatalf("task = %+v, %v; want no token", task, err)
	}
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"OKAY"}`)})
	vfyPingback(t, "/cb?tenant=7", "71000000001", "OKAY")
	waitForState(t, 5*time.Second, "2captcha", "71000000001", store.StateDelivered)
	wantDelivery(t, app, "2captcha:71000000001", "OKAY", "/cb?tenant=7", "res_php", "true", "callback")
}

// tokenRE matches a pingback token pingback_track added to a URL, plain
// (JSON, multipart) or escaped (in.php's urlencoded pingback field).
var tokenRE = regexp.MustCompile(`(\?|&|%3F|%26)` + protocol.TokenParam + `(=|%3D)([0-9a-f]{32})`)

// untokened returns s without the pingback tokens in it, and the last one
// ("" for none) and how many there were: what the app sent, from what the
// provider got.
func untokened(s string) (rest, token string, n int) {
	for _, m := range tokenRE.FindAllStringSubmatch(s, -1) {
		token = m[3]
		n++
	}
	return tokenRE.ReplaceAllString(s, ""), token, n
}

// trkUntoken returns what the provider saw with the token taken out of
// the query, body and parsed pingback, and the token ("" for none; more
// than one fails the test).
func trkUntoken(t *testing.T, s trkSeen) (trkSeen, string) {
	t.Helper()
	q, t1, n1 := untokened(s.RawQuery)
	b, t2, n2 := untokened(string(s.Body))
	if n1+n2 > 1 {
		t.Errorf("the provider got %d tokens, want at most one", n1+n2)
	}
	out := s
	out.RawQuery, out.Body = q, []byte(b)
	if pb := s.Form["pingback"]; len(pb) > 0 {
		out.Form = url.Values{}
		for k, v := range s.Form {
			out.Form[k] = v
		}
		clean := make([]string, len(pb))
		for i, v := range pb {
			clean[i], _, _ = untokened(v)
		}
		out.Form["pingback"] = clean
	}
	return out, t1 + t2
}

// TestVerifyQuarantineCap: a flood of forged pingbacks fills the
// quarantine up to its caps (records, then bytes) and no further: the rest
// are answered 200, not stored, and counted; releasing one makes room.
func TestVerifyQuarantineCap(t *testing.T) {
	app, _ := startVfy(t, "max_quarantine 3", nil)
	full := func() float64 {
		return testutil.ToFloat64(runningApp(t).metrics.callbacks.WithLabelValues("2captcha", "quarantine_full"))
	}
	before := full()
	for i := range 5 {
		vfyPingback(t, "/cb", fmt.Sprint(900+i), "FORGED")
	}
	recs, err := runningApp(t).store(time.Second).List(context.Background(), store.Filter{State: store.StateQuarantined}, 100)
	if err != nil || len(recs) != 3 {
		t.Fatalf("quarantined %d records (%v), want the cap of 3", len(recs), err)
	}
	trkAssertNotStored(t, "903")
	if got := full() - before; got != 2 {
		t.Errorf("callbacks{result=quarantine_full} rose by %v, want 2", got)
	}
	if code, _ := adminDo(t, http.MethodPost, "/pingback/records/2captcha/900/release", ""); code != http.StatusOK {
		t.Fatalf("release: %d", code)
	}
	vfyPingback(t, "/cb", "905", "FORGED")
	if rec := getRecord(t, "2captcha", "905"); rec.State != store.StateQuarantined {
		t.Errorf("after a release, a forgery is %s, want quarantined", rec.State)
	}
	if n := len(app.Requests()); n != 1 {
		t.Errorf("app got %d requests, want the released one", n)
	}
}

// TestVerifyQuarantineByteCap: the byte cap holds whatever the count.
func TestVerifyQuarantineByteCap(t *testing.T) {
	startVfy(t, "max_quarantine 100 2KiB", nil)
	big := strings.Repeat("x", 700)
	for i := range 5 {
		vfyPingback(t, "/cb", fmt.Sprint(950+i), big)
	}
	recs, err := runningApp(t).store(time.Second).List(context.Background(), store.Filter{State: store.StateQuarantined}, 100)
	if err != nil || len(recs) != 1 {
		t.Fatalf("quarantined %d records of about 1.5 KiB each (%v), want 1 under 2 KiB", len(recs), err)
	}
	if g := testutil.ToFloat64(quarantineBytes.WithLabelValues("2captcha")); g < 1400 || g > 2048 {
		t.Errorf("quarantine_bytes gauge %v", g)
	}
}

// TestVerifyReplayStripsToken: a verified pingback the app refused is
// replayed without its token in the URL, still X-Pingback-Verified: token.
func TestVerifyReplayStripsToken(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	app.SetStatus(http.StatusServiceUnavailable)
	startCaddy(t, vfyGlobal(p)+"\n\t\treplay {\n\t\t\tbackoff 20ms 40ms\n\t\t}", vfySite("", "pingback_url "+trkCallbackURL, p.URL, app))
	pb, id := vfySubmit(t, p)
	vfyPingback(t, pathOf(t, pb), id, "REAL")
	waitForState(t, 5*time.Second, "2captcha", id, store.StateFailed)
	app.SetStatus(http.StatusOK)
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	reqs := app.Requests()
	if len(reqs) < 2 {
		t.Fatalf("app got %d requests", len(reqs))
	}
	for _, r := range reqs {
		if r.URI != "/cb" || r.Header.Get(HeaderVerified) != "token" || r.Header.Get(HeaderTracked) != "true" {
			t.Errorf("%s delivery at %s, verified %q tracked %q; want /cb, token, true",
				r.Header.Get(HeaderSource), r.URI, r.Header.Get(HeaderVerified), r.Header.Get(HeaderTracked))
		}
	}
	if last := reqs[len(reqs)-1]; last.Header.Get(HeaderSource) != "replay" {
		t.Errorf("last delivery source %q, want replay", last.Header.Get(HeaderSource))
	}
}

// TestVerifyUnstoredNeverForwarded: a pingback that would be quarantined
// and cannot be stored (a failed commit) is answered 503 and never
// forwarded: an unverified result never reaches the app without its
// verdict on record.
func TestVerifyUnstoredNeverForwarded(t *testing.T) {
	var fail atomic.Bool
	commitFaults := func(o *badgerstore.Options) {
		o.BeforeCommit = func(uint64) error {
			if fail.Load() {
				return errors.New("injected commit failure")
			}
			return nil
		}
	}
	app := newAppStub(t)
	p := newTrkProvider(t)
	startCaddyWith(t, commitFaults, vfyGlobal(p), vfySite("", "pingback_url "+trkCallbackURL, p.URL, app))
	fail.Store(true)
	resp := trkDo(t, http.MethodPost, "/cb", "application/x-www-form-urlencoded", strings.NewReader("id=777&code=FORGED"))
	if resp.status != http.StatusServiceUnavailable {
		t.Errorf("answered %d %q, want 503", resp.status, resp.body)
	}
	if n := len(app.Requests()); n != 0 {
		t.Errorf("the app got %d requests of an unverified, unstored pingback", n)
	}
}

// TestVerifyLocalResSkipsPreSubmission: with unknown_ids accept, a forged
// pingback for the next id is stored (and delivered, untracked) before
// the task exists; once the real task is submitted, pingback_track's
// local res.php does not serve that forgery as the provider's answer: the
// provider is asked.
func TestVerifyLocalResSkipsPreSubmission(t *testing.T) {
	_, p := startVfy(t, "unknown_ids accept", nil)
	vfyPingback(t, "/cb", "71000000001", "FORGED-FUTURE")
	waitForState(t, 5*time.Second, "2captcha", "71000000001", store.StateDelivered)
	_, id := vfySubmit(t, p)
	if id != "71000000001" {
		t.Fatalf("the provider gave id %s, want the forged one", id)
	}
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":0,"request":"CAPCHA_NOT_READY"}`)})
	resp := trkDo(t, http.MethodGet, "/res.php?key="+trkKey+"&action=get&json=1&id="+id, "", nil)
	if strings.Contains(string(resp.body), "FORGED") || len(p.requests("res.php")) == 0 {
		t.Errorf("local res.php served a result received before its task: %d %s (provider asked %d times)",
			resp.status, resp.body, len(p.requests("res.php")))
	}
	if !strings.Contains(string(resp.body), "CAPCHA_NOT_READY") {
		t.Errorf("local res.php: %s, want the provider's answer", resp.body)
	}
}

// Races between a pingback's verification and other pingbacks or the
// task's commit, each made deterministic with gates in the provider or
// the store (no sleeps).
//
// TestVerifyForgeryDuringConfirmation: verify res_php; a forged pingback
// for the same id arrives while the genuine one is being confirmed (the
// provider's res.php is held open). The forgery never takes the
// confirming record's place: the app receives only the genuine code,
// verified res_php, and the forged code is kept as other_code.
func TestVerifyForgeryDuringConfirmation(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	entered, gate := p.holdResPHP(16, func() bool { return true })
	startCaddy(t, vfyGlobal(p), vfySite("verify res_php", "pingback_url "+trkCallbackURL, p.URL, app))
	_, id := vfySubmit(t, p)
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"REAL"}`)})
	vfyPingback(t, "/cb", id, "REAL")
	<-entered // the confirmation is asking the provider
	vfyPingback(t, "/cb", id, "FORGED")
	close(gate)
	rec := waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	if rec.Code != "REAL" || rec.OtherCode != "FORGED" || rec.Verified != VerifyResPHP {
		t.Errorf("record: code %q other %q verified %q, want REAL, FORGED, res_php", rec.Code, rec.OtherCode, rec.Verified)
	}
	wantDelivery(t, app, "2captcha:"+id, "REAL", "/cb", "res_php", "true", "callback")
}

// gatedInsert holds the handler's insert of a pingback quarantined as an
// unknown id until release is closed, after saying so on entered.
type gatedInsert struct {
	store.Store
	entered chan struct{}
	release chan struct{}
}

func (s *gatedInsert) Insert(ctx context.Context, r *store.Record) (store.InsertResult, error) {
	if r.Quarantine == whyUnknownID {
		s.entered <- struct{}{}
		<-s.release
	}
	return s.Store.Insert(ctx, r)
}

// TestVerifyHeldTaskCommitsBeforeInsert: a genuine pingback (with its
// task's token) finds no task, and the task commits (its re-check finding
// no record yet) before the pingback's quarantined record is inserted.
// The handler re-checks after its insert, so the pingback is delivered,
// verified by its token, instead of staying quarantined for good.
func TestVerifyHeldTaskCommitsBeforeInsert(t *testing.T) {
	gate := &gatedInsert{entered: make(chan struct{}, 1), release: make(chan struct{})}
	app, _ := startVfy(t, "", func(st store.Store) store.Store { gate.Store = st; return gate })
	a := runningApp(t)
	tok := protocol.NewToken()
	id := "71000000009"
	submitted := time.Now().UTC()
	done := make(chan trkResponse, 1)
	go func() {
		done <- trkDo(t, http.MethodPost, "/cb?"+protocol.TokenParam+"="+tok, "application/x-www-form-urlencoded",
			strings.NewReader(url.Values{"id": {id}, "code": {"REAL"}}.Encode()))
	}()
	<-gate.entered // judged an unknown id, not yet inserted
	if _, _, err := a.trackTask(context.Background(), trackSpec{provider: "2captcha", id: id, api: protocol.Legacy,
		pingbackURL: trkCallbackURL, submittedAt: submitted, token: tok}, false); err != nil {
		t.Fatal(err)
	}
	close(gate.release)
	if resp := <-done; resp.status != http.StatusOK {
		t.Fatalf("pingback answered %d %s", resp.status, resp.body)
	}
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	wantDelivery(t, app, "2captcha:"+id, "REAL", "/cb", "token", "true", "callback")
}

// TestVerifyUntrackedConflictConfirmed: two pingbacks with different
// codes for an id the plugin does not track (unknown_ids accept): the
// conflict is confirmed with the provider all the same (it has an
// api_key), the provider's answer wins, and the app, already sent the
// first code, gets it as a correction at the URL the pingbacks came to,
// still X-Pingback-Tracked: false.
func TestVerifyUntrackedConflictConfirmed(t *testing.T) {
	app, p := startVfy(t, "unknown_ids accept", nil)
	id := "72000000001"
	vfyPingback(t, "/cb?tenant=3", id, "FORGED")
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"REAL"}`)})
	vfyPingback(t, "/cb?tenant=3", id, "REAL")
	key := "2captcha:" + id + ":correction"
	testkit.WaitFor(t, 10*time.Second, "the correction", func() bool { return len(app.WithKey(key)) > 0 })
	wantDelivery(t, app, key, "REAL", "/cb?tenant=3", "res_php", "false", "correction")
	if n := len(p.requests("res.php")); n != 1 {
		t.Errorf("the provider was asked %d times, want 1", n)
	}
	rec := waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	if rec.Code != "REAL" || rec.OtherCode != "FORGED" || !rec.Correction || rec.Tracked {
		t.Errorf("record code %q other %q correction %v tracked %v", rec.Code, rec.OtherCode, rec.Correction, rec.Tracked)
	}
}

// failingTaskRead is the running store with its task read (or, with
// insert set, its insert) failing with err while fail is set, as a
// PostgreSQL store's does while the database restarts; every other
// operation is the store's own.
type failingTaskRead struct {
	store.Store
	fail   atomic.Bool
	insert bool
	err    error
	reads  atomic.Int32 // failed reads (or inserts)
}

func (s *failingTaskRead) GetTask(ctx context.Context, key store.Key) (*store.Task, error) {
	if s.fail.Load() && !s.insert {
		s.reads.Add(1)
		return nil, s.err
	}
	return s.Store.GetTask(ctx, key)
}

func (s *failingTaskRead) Insert(ctx context.Context, rec *store.Record) (store.InsertResult, error) {
	if s.fail.Load() && s.insert {
		s.reads.Add(1)
		return store.InsertResult{}, s.err
	}
	return s.Store.Insert(ctx, rec)
}

// TestVerifyTaskReadFailureIsStoreDown: with verify token on a tracked
// provider (or verify none and unknown_ids quarantine, which reads the
// task as well), a genuine pingback (its task's token) whose task read
// fails with anything but not found (the database starting up, a read
// slower than ack_timeout) is handled as when the store is down: answered 503
// "result not stored", neither stored (not quarantined unverified) nor
// forwarded, its task left pending. So is one whose task read succeeds
// and whose insert then fails, when this Caddy polls its task (a forward
// without durability would reach the app a second time by polling). Once
// the store is back, the result reaches the app once: by the provider's
// retry of the pingback, or by polling the task when nobody retries.
func TestVerifyTaskReadFailureIsStoreDown(t *testing.T) {
	startingUp := &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"}
	tests := []struct {
		name     string
		lines    string // the pingback handler's
		err      error
		retry    bool   // the provider sends the pingback again; else the poller fetches it
		verified string // the retried pingback's X-Pingback-Verified
		insert   bool   // the task read succeeds and the insert fails
	}{
		{"database starting up, provider retries", "", startingUp, true, "token", false},
		{"read past ack_timeout, task polled", "", fmt.Errorf("reading task: %w", context.DeadlineExceeded), false, "", false},
		// unknown_ids quarantine reads the task too: it cannot tell an
		// unknown id either.
		{"verify none, unknown_ids quarantine", "verify none", startingUp, true, "none", false},
		// Verified, then not stored: a pending task this Caddy polls is
		// left to the poller, not forwarded (that would deliver it twice).
		{"task read, insert fails, task polled", "", startingUp, false, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := newAppStub(t)
			p := newTrkProvider(t)
			global := fmt.Sprintf("provider 2captcha {\n\t\t\tendpoint %s\n\t\t\tapi_key %s\n\t\t}\n\t\tpoll {\n\t\t\tafter 1s\n\t\t\tinterval 5s\n\t\t}", p.URL, trkKey)
			st := &failingTaskRead{err: tt.err, insert: tt.insert}
			startCaddyWrapped(t, func(inner store.Store) store.Store { st.Store = inner; return st },
				global, vfySite(tt.lines, "pingback_url "+trkCallbackURL, p.URL, app))
			a := runningApp(t)
			pingbackURL, id := vfySubmit(t, p)
			storeErrors := a.metrics.callbacks.WithLabelValues("2captcha", "store_error")
			errorsBefore, quarantinedBefore := testutil.ToFloat64(storeErrors), quarantinedCount(t)

			st.fail.Store(true)
			target := pathOf(t, pingbackURL)
			resp := trkDo(t, http.MethodPost, target, "application/x-www-form-urlencoded",
				strings.NewReader(url.Values{"id": {id}, "code": {"REAL"}}.Encode()))
			st.fail.Store(false)
			if resp.status != http.StatusServiceUnavailable || string(resp.body) != "result not stored" {
				t.Errorf("answered %d %q, want 503 \"result not stored\"", resp.status, resp.body)
			}
			if n := st.reads.Load(); n != 1 {
				t.Fatalf("%d failed task reads (or inserts), want the pingback's one", n)
			}
			if _, err := st.Get(context.Background(), store.Key{Provider: "2captcha", ID: id}); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("record after the failed task read: %v, want none (not quarantined)", err)
			}
			if got := quarantinedCount(t) - quarantinedBefore; got != 0 {
				t.Errorf("%v pingbacks counted quarantined, want 0", got)
			}
			if got := testutil.ToFloat64(storeErrors) - errorsBefore; got != 1 {
				t.Errorf("store_error counted %v times, want 1", got)
			}
			if n := len(app.Requests()); n != 0 {
				t.Errorf("the app got %d requests of a pingback that was not stored", n)
			}
			task, err := st.GetTask(context.Background(), store.Key{Provider: "2captcha", ID: id})
			if err != nil || task.State != store.TaskPending {
				t.Fatalf("task after the failed read: %+v, %v; want it pending (to be polled)", task, err)
			}

			// The store is back.
			if tt.retry {
				vfyPingback(t, target, id, "REAL")
				waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
				wantDelivery(t, app, "2captcha:"+id, "REAL", "/cb", tt.verified, "true", "callback")
				return
			}
			p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"REAL"}`)})
			testkit.WaitFor(t, 15*time.Second, "the polled result delivered", func() bool {
				rec, err := st.Get(context.Background(), store.Key{Provider: "2captcha", ID: id})
				return err == nil && rec.State == store.StateDelivered
			})
			wantDelivery(t, app, "2captcha:"+id, "REAL", "/cb", "res_php", "true", "poll")
		})
	}
}
