package pingback

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

func init() {
	caddy.RegisterModule(eventRecorder{})
}

// recordedEvents are the pingback_* events the test subscriber module
// received, across configs.
var recordedEvents eventLog

// eventLog is the events a test subscriber received.
type eventLog struct {
	mu     sync.Mutex
	events []recordedEvent
}

type recordedEvent struct {
	name string
	data map[string]any
	raw  []byte // data as JSON
}

func (l *eventLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = nil
}

// named returns the events named name received so far.
func (l *eventLog) named(name string) []recordedEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []recordedEvent
	for _, e := range l.events {
		if e.name == name {
			out = append(out, e)
		}
	}
	return out
}

// eventRecorder is a test-only events handler module
// (events.handlers.pingback_test_recorder) that records every pingback_*
// event into recordedEvents, as any subscriber of Caddy's events app
// would receive them.
type eventRecorder struct{}

// CaddyModule returns the Caddy module information.
func (eventRecorder) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "events.handlers.pingback_test_recorder",
		New: func() caddy.Module { return new(eventRecorder) },
	}
}

// Handle implements caddyevents.Handler.
func (eventRecorder) Handle(_ context.Context, e caddy.Event) error {
	if !strings.HasPrefix(e.Name(), "pingback_") {
		return nil
	}
	raw, err := json.Marshal(e.Data)
	if err != nil {
		return err
	}
	recordedEvents.mu.Lock()
	defer recordedEvents.mu.Unlock()
	recordedEvents.events = append(recordedEvents.events, recordedEvent{e.Name(), e.Data, raw})
	return nil
}

// startCaddyRecording is startCaddy with the config's events app
// subscribing the test recorder to every event (recordedEvents, emptied
// first); it returns the config loaded.
func startCaddyRecording(t *testing.T, pingbackGlobal, sites string) []byte {
	t.Helper()
	recordedEvents.reset()
	dir := t.TempDir()
	cfg := selfChecked(t, adaptWarned(t, caddyfileFor("storage_dir "+dir+"\n"+pingbackGlobal, sites)))
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	m["apps"].(map[string]any)["events"] = map[string]any{
		"subscriptions": []any{map[string]any{"handlers": []any{map[string]any{"handler": "pingback_test_recorder"}}}},
	}
	cfg, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	loadAdapted(t, cfg)
	t.Cleanup(func() { unloadCaddy(t) })
	return cfg
}

// TestEventsOfParkedResults: every result parked is an event for Caddy's
// events app, and to the notify receiver (signed, after a first POST it
// refused) one message per interval with the count of a flood; a route
// failing for failing_after is reported once, and its recovery too;
// neither ever carries a code or a body.
func TestEventsOfParkedResults(t *testing.T) {
	app := newAppStub(t)
	app.SetStatus(http.StatusServiceUnavailable)
	rcv := newNotifyReceiver(t, "notify-test-secret")
	rcv.fail = 1 // the first POST is refused, then retried
	t.Setenv("PINGBACK_TEST_NOTIFY_SECRET", "notify-test-secret")
	startCaddyRecording(t, fmt.Sprintf(`replay {
	backoff 20ms 40ms
	max_attempts 1
}
notify %s {
	secret {env.PINGBACK_TEST_NOTIFY_SECRET}
	interval 1h
}
failing_after 1s`, rcv.srv.URL), pingbackSite("captchaai", "", app))

	const flood = 30
	var wg sync.WaitGroup
	for i := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if status, _ := testkit.Get(t, fmt.Sprintf("%s/cb?id=%d&code=SECRETCODE%d", testBase, 36000+i, i)); status != http.StatusOK {
				t.Errorf("pingback %d answered %d", i, status)
			}
		}()
	}
	wg.Wait()
	for i := range flood {
		waitForState(t, 10*time.Second, "captchaai", fmt.Sprint(36000+i), store.StateParked)
	}

	// Caddy's events app: one event per parked result.
	testkit.WaitFor(t, 10*time.Second, "an event per parked result", func() bool {
		return len(recordedEvents.named(EventResultParked)) == flood
	})
	e := recordedEvents.named(EventResultParked)[0]
	if e.data["provider"] != "captchaai" || e.data["failures"] != 1 || e.data["count"] != 1 {
		t.Errorf("parked event data %v, want provider captchaai, failures 1, count 1", e.data)
	}

	// The route fails for failing_after: reported once.
	testkit.WaitFor(t, 10*time.Second, "pingback_route_failing", func() bool {
		return len(recordedEvents.named(EventRouteFailing)) == 1
	})
	failing := recordedEvents.named(EventRouteFailing)[0].data
	route := "localhost:" + testHTTPPort + "/cb"
	if failing["route"] != route || failing["provider"] != "captchaai" || failing["failures"] != flood || failing["failing_since"] == nil {
		t.Errorf("route failing data %v, want route %s, provider captchaai, failures %d and failing_since", failing, route, flood)
	}

	// The notify receiver: the flood coalesced into the messages of one
	// interval (the first is sent a second after the first event; the
	// rest wait out the interval, 1h), signed (the receiver checks).
	msgs := waitNotified(t, rcv, EventResultParked, "captchaai", 1)
	testkit.HoldsFor(t, 1500*time.Millisecond, "one parked message", func() bool {
		return len(rcv.messages(EventResultParked, "captchaai")) == 1
	})
	m := msgs[0]
	if m.Count < 1 || m.Count > flood || m.FirstAt.IsZero() || m.LastAt.Before(m.FirstAt) {
		t.Errorf("parked message %+v, want a count of the flood and its times", m)
	}
	rcv.mu.Lock()
	refused := rcv.fail
	rcv.mu.Unlock()
	if refused != 0 {
		t.Errorf("the receiver's 500 was never met")
	}
	waitNotified(t, rcv, EventRouteFailing, "captchaai", 1)

	// The route recovers: one replay by hand delivers.
	app.SetStatus(http.StatusOK)
	if status, body := adminDo(t, http.MethodPost, "/pingback/records/captchaai/36000/replay", ""); status != http.StatusOK {
		t.Fatalf("replay: %d %s", status, body)
	}
	testkit.WaitFor(t, 10*time.Second, "pingback_route_recovered", func() bool {
		return len(recordedEvents.named(EventRouteRecovered)) == 1
	})
	waitNotified(t, rcv, EventRouteRecovered, "captchaai", 1)

	// Never a code or a body, in either channel.
	var all []byte
	recordedEvents.mu.Lock()
	for _, e := range recordedEvents.events {
		all = append(all, e.raw...)
	}
	recordedEvents.mu.Unlock()
	for what, b := range map[string][]byte{"events": all, "notify": rcv.raw()} {
		if bytes.Contains(b, []byte("SECRETCODE")) || bytes.Contains(b, []byte("code=")) || bytes.Contains(b, []byte("notify-test-secret")) {
			t.Errorf("%s carry a code or the secret: %s", what, b)
		}
	}

	// /pingback/status lists them, newest first.
	status, body := adminDo(t, http.MethodGet, "/pingback/status", "")
	if status != http.StatusOK {
		t.Fatalf("status: %d %s", status, body)
	}
	var ans adminapi.StatusAnswer
	if err := json.Unmarshal(body, &ans); err != nil {
		t.Fatal(err)
	}
	if len(ans.Notifications) == 0 || ans.Notifications[0].Event != EventRouteRecovered {
		t.Errorf("notifications %+v, want the recovery first", ans.Notifications)
	}
	if len(ans.Notifications) > recentNotifications {
		t.Errorf("%d notifications listed, want at most %d", len(ans.Notifications), recentNotifications)
	}
}

// TestEventsOfAQuarantineFlood: a flood of forgeries is summarised, one
// pingback_results_quarantined per provider and interval with the count,
// never one event per forgery.
func TestEventsOfAQuarantineFlood(t *testing.T) {
	app := newAppStub(t)
	p := newTrkProvider(t)
	rcv := newNotifyReceiver(t, "q-secret")
	startCaddyRecording(t, vfyGlobal(p)+fmt.Sprintf("\nnotify %s {\n\tsecret q-secret\n\tinterval 2s\n}", rcv.srv.URL),
		vfySite("", "pingback_url "+trkCallbackURL, p.URL, app))
	const flood = 40
	for i := range flood {
		vfyPingback(t, "/cb", fmt.Sprint(46000+i), fmt.Sprintf("FORGEDCODE%d", i))
	}
	if got := quarantinedCount(t); got < flood {
		t.Fatalf("%v quarantined, want %d", got, flood)
	}
	var summed int
	testkit.WaitFor(t, 20*time.Second, "the flood summarised", func() bool {
		summed = 0
		for _, e := range recordedEvents.named(EventResultsQuarantined) {
			summed += e.data["count"].(int)
		}
		return summed >= flood
	})
	events := recordedEvents.named(EventResultsQuarantined)
	if summed != flood || len(events) > 5 {
		t.Errorf("%d events counting %d, want at most 5 counting %d", len(events), summed, flood)
	}
	for _, e := range events {
		if e.data["provider"] != "2captcha" || e.data["first_at"] == nil || e.data["last_at"] == nil {
			t.Errorf("quarantined event data %v", e.data)
		}
		if bytes.Contains(e.raw, []byte("FORGEDCODE")) {
			t.Errorf("quarantined event carries a code: %s", e.raw)
		}
	}
	waitNotified(t, rcv, EventResultsQuarantined, "2captcha", flood)
	if b := rcv.raw(); bytes.Contains(b, []byte("FORGEDCODE")) {
		t.Errorf("notify message carries a code: %s", b)
	}
}

// Interface guards
var _ caddyevents.Handler = eventRecorder{}

// TestEventsOfResultsExpiring: undelivered results with an hour of
// retention left are counted per provider in one event, each result once
// however often the housekeeping looks.
func TestEventsOfResultsExpiring(t *testing.T) {
	app := newAppStub(t)
	startCaddyRecording(t, "retention 2h", pingbackSite("captchaai", "", app))
	now := time.Now().UTC()
	for i, c := range []struct {
		state store.State
		age   time.Duration
	}{
		{store.StateParked, 70 * time.Minute},    // 50 min left: expiring
		{store.StateRejected, 80 * time.Minute},  // expiring
		{store.StateFailed, 30 * time.Minute},    // 90 min left: not yet
		{store.StateDelivered, 90 * time.Minute}, // delivered: nothing to say
	} {
		rec := storedCallback(t, fmt.Sprint(38000+i), c.state, 1, time.Time{})
		rec.ReceivedAt = now.Add(-c.age)
		rec.ExpiresAt = rec.ReceivedAt.Add(2 * time.Hour)
		if c.state == store.StateFailed {
			rec.DueAt = now.Add(time.Hour)
		}
		insertRecord(t, rec)
	}
	a := runningApp(t)
	st := a.store(time.Second)
	a.checkExpiring(st)
	testkit.WaitFor(t, 5*time.Second, "pingback_results_expiring", func() bool {
		return len(recordedEvents.named(EventResultsExpiring)) == 1
	})
	e := recordedEvents.named(EventResultsExpiring)[0]
	if e.data["provider"] != "captchaai" || e.data["count"] != 2 || e.data["first_expires_at"] != rfc3339(now.Add(-80*time.Minute+2*time.Hour)) {
		t.Errorf("expiring event %v, want captchaai, count 2, the first expiry", e.data)
	}
	a.checkExpiring(st)
	testkit.HoldsFor(t, 300*time.Millisecond, "no second event for the same results", func() bool {
		return len(recordedEvents.named(EventResultsExpiring)) == 1
	})
}

// TestEventsOfResultsExpiringInRounds: a round that looks at its most
// records goes on where it stopped in the next, counting each result once.
func TestEventsOfResultsExpiringInRounds(t *testing.T) {
	app := newAppStub(t)
	startCaddyRecording(t, "retention 2h", pingbackSite("captchaai", "", app))
	now := time.Now().UTC()
	for i := range 3 {
		rec := storedCallback(t, fmt.Sprint(38100+i), store.StateParked, 1, time.Time{})
		rec.ReceivedAt = now.Add(-70*time.Minute - time.Duration(i)*time.Second)
		rec.ExpiresAt = rec.ReceivedAt.Add(2 * time.Hour)
		insertRecord(t, rec)
	}
	a := runningApp(t)
	a.handle.events.mu.Lock()
	a.handle.events.scanMax = 1
	a.handle.events.mu.Unlock()
	st := a.store(time.Second)
	for range 5 {
		a.checkExpiring(st)
	}
	testkit.WaitFor(t, 5*time.Second, "three events", func() bool {
		return len(recordedEvents.named(EventResultsExpiring)) == 3
	})
	for _, e := range recordedEvents.named(EventResultsExpiring) {
		if e.data["count"] != 1 {
			t.Errorf("event %v, want a count of 1 per round", e.data)
		}
	}
	testkit.HoldsFor(t, 300*time.Millisecond, "no fourth event", func() bool {
		return len(recordedEvents.named(EventResultsExpiring)) == 3
	})
}

// TestEventsOfARejectedKey: a key the provider rejects is one event,
// naming the account by its id, never the key, however often it is
// answered so.
func TestEventsOfARejectedKey(t *testing.T) {
	app := newAppStub(t)
	startCaddyRecording(t, "", pingbackSite("captchaai", "", app))
	a := runningApp(t)
	acct := store.Account{Provider: "2captcha", ID: accountID("2captcha", "the-api-key-itself")}
	as := a.handle.account(acct)
	for range 3 {
		a.onAnswer(acct, as, nil, protocol.Answer{Kind: protocol.KeyError, Code: "ERROR_KEY_DOES_NOT_EXIST"}, time.Now())
	}
	testkit.WaitFor(t, 5*time.Second, "pingback_api_key_rejected", func() bool {
		return len(recordedEvents.named(EventAPIKeyRejected)) == 1
	})
	testkit.HoldsFor(t, 300*time.Millisecond, "one event", func() bool {
		return len(recordedEvents.named(EventAPIKeyRejected)) == 1
	})
	e := recordedEvents.named(EventAPIKeyRejected)[0]
	if e.data["provider"] != "2captcha" || e.data["account"] != acct.ID || bytes.Contains(e.raw, []byte("the-api-key-itself")) {
		t.Errorf("key rejected event %s, want 2captcha's account %s and no key", e.raw, acct.ID)
	}
}

// switchedStore is a store whose availability the test sets.
type switchedStore struct {
	store.Store
	up atomic.Bool
}

func (s *switchedStore) Available() bool { return s.up.Load() }

// TestEventsOfStoreAvailability: the store going away and coming back are
// one event each, however many rounds look at it meanwhile.
func TestEventsOfStoreAvailability(t *testing.T) {
	app := newAppStub(t)
	startCaddyRecording(t, "", pingbackSite("captchaai", "", app))
	a := runningApp(t)
	sw := &switchedStore{}
	sw.up.Store(true)
	h := &storeHandle{store: sw}
	names := func() []string {
		var out []string
		recordedEvents.mu.Lock()
		defer recordedEvents.mu.Unlock()
		for _, e := range recordedEvents.events {
			if e.name == EventStoreAvailable || e.name == EventStoreUnavailable {
				out = append(out, e.name)
			}
		}
		return out
	}
	for _, up := range []bool{true, true, false, false, false, true, true} {
		sw.up.Store(up)
		a.checkStoreAvailability(h)
	}
	want := []string{EventStoreUnavailable, EventStoreAvailable}
	testkit.WaitFor(t, 5*time.Second, "unavailable, then available", func() bool { return slices.Equal(names(), want) })
	testkit.HoldsFor(t, 300*time.Millisecond, "two events", func() bool { return slices.Equal(names(), want) })
	if e := recordedEvents.named(EventStoreUnavailable)[0]; e.data["provider"] != "" || e.data["store"] != "badger" {
		t.Errorf("store event data %v, want no provider and the store's kind", e.data)
	}
}

// TestEventsOfAnAccountOutOfBudget: an account whose res.php budget is
// spent is one event naming the account id.
func TestEventsOfAnAccountOutOfBudget(t *testing.T) {
	app := newAppStub(t)
	startCaddyRecording(t, "", pingbackSite("captchaai", "", app))
	a := runningApp(t)
	acc := account{id: accountID("2captcha", "budget-key"), key: "budget-key"}
	as := a.handle.account(store.Account{Provider: "2captcha", ID: acc.id})
	as.mu.Lock()
	as.polls = 10 * pollAllowance
	as.mu.Unlock()
	for range 3 {
		a.pollAccount("2captcha", acc, nil, time.Now())
	}
	testkit.WaitFor(t, 5*time.Second, "pingback_account_out_of_budget", func() bool {
		return len(recordedEvents.named(EventAccountOutOfBudget)) == 1
	})
	testkit.HoldsFor(t, 300*time.Millisecond, "one event", func() bool {
		return len(recordedEvents.named(EventAccountOutOfBudget)) == 1
	})
	if e := recordedEvents.named(EventAccountOutOfBudget)[0]; e.data["account"] != acc.id || bytes.Contains(e.raw, []byte("budget-key")) {
		t.Errorf("out of budget event %s, want account %s and no key", e.raw, acc.id)
	}
}

// TestEventsStopWithTheConfig: the emitter's, the watcher's and the
// notifier's goroutines end when their config is unloaded, and a reload
// leaves one set running.
func TestEventsStopWithTheConfig(t *testing.T) {
	rcv := newNotifyReceiver(t, "s")
	app := newAppStub(t)
	global := fmt.Sprintf("notify %s {\n\tsecret s\n}", rcv.srv.URL)
	cfg := startCaddyRecording(t, global, pingbackSite("captchaai", "", app))
	running := func(fn string) int {
		buf := make([]byte, 8<<20)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), fn+"(")
	}
	fns := []string{"pingback.(*App).emitLoop", "pingback.(*App).watchLoop", "notify.(*Notifier).run"}
	for _, fn := range fns {
		if n := running(fn); n != 1 {
			t.Errorf("%d goroutines in %s while running, want 1", n, fn)
		}
	}
	before := runningApp(t)
	loadAdapted(t, cfg) // a reload: the old config's stop
	if runningApp(t) == before {
		t.Fatal("the config was not reloaded")
	}
	for _, fn := range fns {
		testkit.WaitFor(t, 5*time.Second, fn+" once after a reload", func() bool { return running(fn) == 1 })
	}
	unloadCaddy(t)
	for _, fn := range fns {
		testkit.WaitFor(t, 5*time.Second, fn+" to end", func() bool { return running(fn) == 0 })
	}
}

// TestEventsOfAPauseAndResume: a pause and a resume by hand are events
// for Caddy's events app, each naming the provider, the reason and who
// made it.
func TestEventsOfAPauseAndResume(t *testing.T) {
	app := newAppStub(t)
	startCaddyRecording(t, "", pingbackSite("captchaai", "", app))
	if status, body := adminDo(t, http.MethodPost, "/pingback/pauses", `{"provider": "captchaai", "reason": "deploy", "by": "cli"}`); status != http.StatusOK {
		t.Fatalf("pause: %d %s", status, body)
	}
	if status, body := adminDo(t, http.MethodDelete, "/pingback/pauses/captchaai?by=console", ""); status != http.StatusOK {
		t.Fatalf("resume: %d %s", status, body)
	}
	testkit.WaitFor(t, 5*time.Second, "pingback_provider_paused and pingback_provider_resumed", func() bool {
		return len(recordedEvents.named(EventProviderPaused)) == 1 && len(recordedEvents.named(EventProviderResumed)) == 1
	})
	for _, tc := range []struct {
		name, by string
	}{{EventProviderPaused, "cli"}, {EventProviderResumed, "console"}} {
		e := recordedEvents.named(tc.name)[0]
		if e.data["provider"] != "captchaai" || e.data["reason"] != "deploy" || e.data["by"] != tc.by {
			t.Errorf("%s: %s, want captchaai, reason deploy, by %s", tc.name, e.raw, tc.by)
		}
	}
}
