package pingback

import (
	"net/http"
	"strings"
	"testing"

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
