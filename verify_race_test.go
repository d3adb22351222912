package pingback

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/protocol"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Races between a pingback's verification and other pingbacks or the
// task's commit, each made deterministic with gates in the provider or
// the store (no sleeps).

// TestVerifyForgeryDuringConfirmation: verify res_php; a forged pingback
// for the same id arrives while the genuine one is being confirmed (the
// provider's res.php is held open). The forgery never takes the
// confirming record's place: the app receives only the genuine code,
// verified res_php, and the forged code is kept as other_code.
func TestVerifyForgeryDuringConfirmation(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	gate := make(chan struct{})
	entered := make(chan struct{}, 16)
	orig := p.Server.Config.Handler
	p.Server.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "res.php") {
			entered <- struct{}{}
			<-gate
		}
		orig.ServeHTTP(w, r)
	})
	startCaddy(t, vfyGlobal(p), vfySite("verify res_php", "pingback_url "+trkCallbackURL, p.URL, app))
	_, id := vfySubmit(t, p)
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"REAL"}`)})
	vfyPingback(t, "/cb", id, "REAL")
	<-entered // the confirmation is asking the provider
	vfyPingback(t, "/cb", id, "FORGED")
	close(gate)
	rec := waitForState(t, "2captcha", id, store.StateDelivered)
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
	app := newAppStub(t)
	p := newTrkProvider(t)
	startCaddy(t, vfyGlobal(p), vfySite("", "pingback_url "+trkCallbackURL, p.URL, app))
	a := runningApp(t)
	gate := &gatedInsert{Store: a.handle.store, entered: make(chan struct{}, 1), release: make(chan struct{})}
	a.handle.store = gate
	t.Cleanup(func() { a.handle.store = gate.Store })
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
	waitForState(t, "2captcha", id, store.StateDelivered)
	wantDelivery(t, app, "2captcha:"+id, "REAL", "/cb", "token", "true", "callback")
}

// TestVerifyUntrackedConflictConfirmed: two pingbacks with different
// codes for an id the plugin does not track (unknown_ids accept): the
// conflict is confirmed with the provider all the same (it has an
// api_key), the provider's answer wins, and the app, already sent the
// first code, gets it as a correction at the URL the pingbacks came to,
// still X-Pingback-Tracked: false.
func TestVerifyUntrackedConflictConfirmed(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	startCaddy(t, vfyGlobal(p), vfySite("unknown_ids accept", "pingback_url "+trkCallbackURL, p.URL, app))
	id := "72000000001"
	vfyPingback(t, "/cb?tenant=3", id, "FORGED")
	waitForState(t, "2captcha", id, store.StateDelivered)
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"REAL"}`)})
	vfyPingback(t, "/cb?tenant=3", id, "REAL")
	key := "2captcha:" + id + ":correction"
	waitFor(t, 10*time.Second, "the correction", func() bool { return len(app.withKey(key)) > 0 })
	wantDelivery(t, app, key, "REAL", "/cb?tenant=3", "res_php", "false", "correction")
	if n := len(p.requests("res.php")); n != 1 {
		t.Errorf("the provider was asked %d times, want 1", n)
	}
	rec := waitForState(t, "2captcha", id, store.StateDelivered)
	if rec.Code != "REAL" || rec.OtherCode != "FORGED" || !rec.Correction || rec.Tracked {
		t.Errorf("record code %q other %q correction %v tracked %v", rec.Code, rec.OtherCode, rec.Correction, rec.Tracked)
	}
}
