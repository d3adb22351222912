package pingback

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/store"
)

// gatedList, once armed, holds every listing of quarantined records
// until release is closed, after saying so on entered.
type gatedList struct {
	store.Store
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (s *gatedList) List(ctx context.Context, f store.Filter, limit int) ([]*store.Record, error) {
	if f.State == store.StateQuarantined && s.armed.Load() {
		s.entered <- struct{}{}
		<-s.release
	}
	return s.Store.List(ctx, f, limit)
}

// TestQuarantineBytesNotReadInRequest: once the quarantine's bytes are
// known, records leaving quarantine (a release) never make a pingback's
// request read the quarantine again: with the store's listing held open,
// a further untrusted pingback is answered at once; the read runs in the
// background, once.
func TestQuarantineBytesNotReadInRequest(t *testing.T) {
	gate := &gatedList{entered: make(chan struct{}, 8), release: make(chan struct{})}
	startVfy(t, "", func(st store.Store) store.Store { gate.Store = st; return gate })
	vfyPingback(t, "/cb", "811", "A") // the bytes are read (inline, once) and known
	admin := "/pingback/records/2captcha/"
	if code, body := adminDo(t, http.MethodPost, admin+"811/release", ""); code != http.StatusOK {
		t.Fatalf("release = %d %s", code, body)
	}
	gate.armed.Store(true)
	// The bytes this process knows.
	q := &runningApp(t).handle.quarantine
	q.mu.Lock()
	var u quarantineUse
	if p := q.m["2captcha"]; p != nil {
		u = *p
	}
	q.mu.Unlock()
	if !u.known || !u.stale {
		t.Fatalf("quarantine bytes before: %+v, want known and stale (a record left)", u)
	}
	answered := make(chan trkResponse, 2)
	for _, id := range []string{"812", "813"} {
		go func() {
			answered <- trkDo(t, http.MethodPost, "/cb", "application/x-www-form-urlencoded",
				strings.NewReader(url.Values{"id": {id}, "code": {"B"}}.Encode()))
		}()
	}
	for range 2 {
		select {
		case resp := <-answered:
			if resp.status != http.StatusOK {
				t.Errorf("pingback answered %d %s", resp.status, resp.body)
			}
		case <-time.After(10 * time.Second):
			close(gate.release)
			t.Fatal("a pingback's answer waits for a read of the whole quarantine")
		}
	}
	<-gate.entered // the one background read
	close(gate.release)
	if n := len(gate.entered); n != 0 {
		t.Errorf("%d more reads of the quarantine, want one in all", n)
	}
}

// TestQuarantineBytesAfterPurge: a byte cap filled by forgeries takes
// pingbacks again as soon as they are purged.
func TestQuarantineBytesAfterPurge(t *testing.T) {
	startVfy(t, "max_quarantine 100 2KiB", nil)
	full := func() float64 {
		return testutil.ToFloat64(runningApp(t).metrics.callbacks.WithLabelValues("2captcha", "quarantine_full"))
	}
	big := strings.Repeat("x", 700)
	vfyPingback(t, "/cb", "960", big)
	before := full()
	vfyPingback(t, "/cb", "961", big)
	if full() != before+1 {
		t.Fatalf("the second big forgery was not refused (quarantine_full %v → %v)", before, full())
	}
	if status, body := adminDo(t, http.MethodDelete, "/pingback/records/2captcha/960", ""); status != http.StatusOK {
		t.Fatalf("purge = %d %s", status, body)
	}
	vfyPingback(t, "/cb", "962", big)
	if full() != before+1 {
		t.Errorf("a pingback after the purge was refused as quarantine_full")
	}
	if rec := getRecord(t, "2captcha", "962"); rec.State != store.StateQuarantined {
		t.Errorf("pingback after the purge: %s, want quarantined", rec.State)
	}
	if g := testutil.ToFloat64(quarantineBytes.WithLabelValues("2captcha")); g < 700 || g > 2048 {
		t.Errorf("quarantine_bytes gauge %v after the purge and one more", g)
	}
}
