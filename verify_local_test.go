package pingback

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestVerifyLocalResSkipsPreSubmission: with unknown_ids accept, a forged
// pingback for the next id is stored (and delivered, untracked) before
// the task exists; once the real task is submitted, pingback_track's
// local res.php does not serve that forgery as the provider's answer: the
// provider is asked.
func TestVerifyLocalResSkipsPreSubmission(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	startCaddy(t, vfyGlobal(p), vfySite("unknown_ids accept", "pingback_url "+trkCallbackURL, p.URL, app))
	vfyPingback(t, "/cb", "71000000001", "FORGED-FUTURE")
	waitForState(t, "2captcha", "71000000001", store.StateDelivered)
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
