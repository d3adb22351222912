package pingback

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

func TestSmokeCallbackReachesApp(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "", app))
	status, body := get(t, testBase+"/cb?id=42&code=TOKEN")
	if status != http.StatusOK || body != "OK" {
		t.Fatalf("got %d %q, want 200 OK", status, body)
	}
	waitFor(t, 5*time.Second, "the app to receive the callback", func() bool { return app.count("captchaai:42") == 1 })
	waitFor(t, 5*time.Second, "delivered state", func() bool { return getRecord(t, "captchaai", "42").State == store.StateDelivered })
}
