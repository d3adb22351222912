package pingback

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestMaxAgeExpiresPingbacksHeldByAPause: a live pingback held by a pause
// for longer than its provider's max_age is expired when the pause ends,
// never forwarded and with no attempt spent (the stale token a long pause
// made does not reach the app); one held for less than max_age is
// delivered on resume as its live forward.
func TestMaxAgeExpiresPingbacksHeldByAPause(t *testing.T) {
	clock := ageClock()
	app := newAppStub(t)
	startCaddyClocked(t, clock, maxAgeGlobal("max_age 5m"), pingbackSite("2captcha", "", app))
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "2captcha"}`); status != http.StatusOK {
		t.Fatalf("pause: %d %s", status, body)
	}
	postPingback(t, "7001", nil)
	clock.Advance(4 * time.Minute)
	postPingback(t, "7002", nil)
	clock.Advance(2 * time.Minute) // 7001 held 6 minutes, 7002 held 2
	if n := len(app.Requests()); n != 0 {
		t.Fatalf("the app got %d requests while 2captcha was paused, want none", n)
	}
	if status, body := adminDo(t, http.MethodDelete, "/pingback/pauses/2captcha", ""); status != http.StatusOK {
		t.Fatalf("resume: %d %s", status, body)
	}

	if rec := waitForState(t, 5*time.Second, "2captcha", "7001", store.StateExpired); rec.ExpiredReason != expiredMaxAge || rec.Attempts != 0 {
		t.Errorf("7001 held past max_age: expired with reason %q after %d attempts, want max_age after 0", rec.ExpiredReason, rec.Attempts)
	}
	if rec := waitForState(t, 5*time.Second, "2captcha", "7002", store.StateDelivered); rec.Attempts != 1 {
		t.Errorf("7002 held less than max_age: delivered after %d attempts, want 1", rec.Attempts)
	}
	if n := len(app.WithKey("2captcha:7001")); n != 0 {
		t.Errorf("7001: the app got %d requests, want none", n)
	}
	if reqs := app.WithKey("2captcha:7002"); len(reqs) != 1 || reqs[0].Header.Get(HeaderSource) != "callback" {
		t.Errorf("7002: the app got %d requests, want its live forward once", len(reqs))
	}
}
