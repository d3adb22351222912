package pingback

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testfs"
)

// TestFullDiskIsAStorageOutage: with the storage directory on a small
// filesystem filled below min_free_space, Caddy stays up; a pingback gets
// 200 only if the app took it, else 503; the availability gauge says 0.
// Once space is freed, new pingbacks are stored and delivered again,
// without a restart, and the result stored before is intact. (Needs root to
// mount the filesystem; skipped otherwise. CI runs as root.)
func TestFullDiskIsAStorageOutage(t *testing.T) {
	fs := testfs.Small(t, store.DefaultMinFreeSpace+64<<20)
	dir := filepath.Join(fs, "pingback")
	app := newAppStub(t)
	startCaddy(t, "storage_dir "+dir+"\nreplay {\n\tbackoff 20ms 40ms\n}", pingbackSite("captchaai", "ack_timeout 500ms", app))
	a := runningApp(t)
	gauge := func() float64 { return testutil.ToFloat64(a.metrics.storeAvailable) }

	pingback := func(id string) (int, string) {
		t.Helper()
		return get(t, testBase+"/cb?id="+id+"&code=TOKEN-"+id)
	}
	stored := func(id string) bool {
		_, err := a.handle.store.Get(context.Background(), store.Key{Provider: "captchaai", ID: id})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("get %s: %v", id, err)
		}
		return err == nil
	}

	if status, body := pingback("37001"); status != http.StatusOK || body != "OK" {
		t.Fatalf("before the disk fills: %d %q, want 200 OK", status, body)
	}
	waitForState(t, "captchaai", "37001", store.StateDelivered)

	free := testfs.Fill(t, fs, store.DefaultMinFreeSpace-16<<20)
	waitFor(t, 5*time.Second, "the store to report itself unavailable", func() bool { return !a.handle.store.Available() })
	waitFor(t, 5*time.Second, "the gauge to say 0", func() bool { return gauge() == 0 })

	// The app takes it: the provider gets 200, though nothing is stored.
	if status, body := pingback("37002"); status != http.StatusOK || body != "OK" {
		t.Errorf("full disk, app up: %d %q, want 200 OK", status, body)
	}
	if stored("37002") || app.deliveries("captchaai:37002") != 1 {
		t.Errorf("full disk, app up: stored %v, delivered %d times; want not stored, delivered once", stored("37002"), app.deliveries("captchaai:37002"))
	}
	// The app refuses it: the provider must try again.
	app.setStatus(http.StatusServiceUnavailable)
	if status, body := pingback("37003"); status != http.StatusServiceUnavailable || body != "result not stored and not delivered" {
		t.Errorf("full disk, app down: %d %q, want 503 \"result not stored and not delivered\"", status, body)
	}
	if stored("37003") {
		t.Error("full disk: 37003 was stored")
	}
	// Caddy still serves other requests: the admin endpoint answers.
	if status, _ := get(t, "http://"+testAdmin+"/config/"); status != http.StatusOK {
		t.Errorf("admin endpoint answered %d during the outage", status)
	}

	app.setStatus(http.StatusOK)
	free()
	waitFor(t, 5*time.Second, "storing to resume", func() bool { return a.handle.store.Available() })
	if status, body := pingback("37004"); status != http.StatusOK || body != "OK" {
		t.Errorf("after freeing space: %d %q, want 200 OK", status, body)
	}
	rec := waitForState(t, "captchaai", "37004", store.StateDelivered)
	if rec.Code != "TOKEN-37004" {
		t.Errorf("37004 stored with code %q", rec.Code)
	}
	if rec := getRecord(t, "captchaai", "37001"); rec.State != store.StateDelivered || rec.Code != "TOKEN-37001" {
		t.Errorf("the result stored before the outage: %s %q", rec.State, rec.Code)
	}
	waitFor(t, 5*time.Second, "the gauge to say 1", func() bool { return gauge() == 1 })
}
