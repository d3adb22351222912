package pingback

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestConfirmQueueBounds: one job per key, at most confirmQueueSize per
// provider, a finished job frees its slot.
func TestConfirmQueueBounds(t *testing.T) {
	var q confirmQueue
	k := func(p string, i int) store.Key { return store.Key{Provider: p, ID: fmt.Sprint(i)} }
	if got := q.take(k("a", 0)); got != confirmStarted {
		t.Fatalf("first job: %v", got)
	}
	if got := q.take(k("a", 0)); got != confirmCoalesced {
		t.Errorf("second job for the same key: %v, want coalesced", got)
	}
	for i := 1; i < confirmQueueSize; i++ {
		if got := q.take(k("a", i)); got != confirmStarted {
			t.Fatalf("job %d: %v", i, got)
		}
	}
	if got := q.take(k("a", confirmQueueSize)); got != confirmDropped {
		t.Errorf("job past the queue: %v, want dropped", got)
	}
	if got := q.take(k("b", 0)); got != confirmStarted {
		t.Errorf("another provider's job: %v, want started", got)
	}
	q.done(k("a", 3))
	if got := q.take(k("a", confirmQueueSize)); got != confirmStarted {
		t.Errorf("job after one finished: %v, want started", got)
	}
	if n := q.pending("a"); n != confirmQueueSize {
		t.Errorf("pending %d, want %d", n, confirmQueueSize)
	}
}

// TestVerifyConflictFloodBounded: 300 forged pingbacks with different
// codes for a delivered res_php task, while the provider's res.php is
// held open: one settlement is in flight, the others coalesce into it,
// and the provider is asked once in all. With the in-process res.php
// budget spent, a further conflict asks nothing and keeps the first code.
func TestVerifyConflictFloodBounded(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	var held atomic.Bool
	entered, gate := p.holdResPHP(400, held.Load)
	startCaddy(t, vfyGlobal(p), vfySite("verify res_php", "pingback_url "+trkCallbackURL, p.URL, app))
	_, id := vfySubmit(t, p)
	p.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":"REAL"}`)})
	vfyPingback(t, "/cb", id, "REAL")
	waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	a := runningApp(t)
	count := func(outcome string) float64 {
		return testutil.ToFloat64(confirmations.WithLabelValues("2captcha", outcome))
	}
	started, coalesced := count("started"), count("coalesced")
	res0 := len(p.requests("res.php"))

	held.Store(true)
	for i := range 300 {
		vfyPingback(t, "/cb", id, fmt.Sprintf("FORGED%d", i))
	}
	<-entered // the one settlement is asking
	if n := a.handle.confirms.pending("2captcha"); n != 1 {
		t.Errorf("%d confirmation jobs in flight, want 1", n)
	}
	if d := count("started") - started; d != 1 {
		t.Errorf("%v settlements started, want 1", d)
	}
	if d := count("coalesced") - coalesced; d != 299 {
		t.Errorf("%v settlements coalesced, want 299", d)
	}
	close(gate)
	testkit.WaitFor(t, 5*time.Second, "the settlement to end", func() bool { return a.handle.confirms.pending("2captcha") == 0 })
	if n := len(p.requests("res.php")) - res0; n != 1 {
		t.Errorf("the provider was asked %d times, want 1", n)
	}
	if rec := getRecord(t, "2captcha", id); rec.Code != "REAL" || rec.Correction {
		t.Errorf("record after the flood: code %q correction %v, want REAL, none", rec.Code, rec.Correction)
	}

	// The budget spent (on Badger: in process): nothing asked, first code kept.
	ps := a.handle.account(store.Account{Provider: "2captcha", ID: a.providerConfig("2captcha").accounts[0].id})
	ps.mu.Lock()
	ps.polls = 10*ps.tracked + pollAllowance
	ps.mu.Unlock()
	res1 := len(p.requests("res.php"))
	vfyPingback(t, "/cb", id, "FORGED-LAST")
	testkit.WaitFor(t, 5*time.Second, "the settlement to end", func() bool {
		return a.handle.confirms.pending("2captcha") == 0 && getRecord(t, "2captcha", id).OtherCode == "FORGED-LAST"
	})
	if n := len(p.requests("res.php")) - res1; n != 0 {
		t.Errorf("over budget, the provider was asked %d times, want 0", n)
	}
}
