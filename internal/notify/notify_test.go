package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// receiver is a notify endpoint on loopback that checks each POST's
// signature and answers with the statuses it is given in turn (then 200).
type receiver struct {
	t      *testing.T
	secret string
	srv    *httptest.Server

	mu       sync.Mutex
	statuses []int
	posts    [][]Message
	bodies   [][]byte
}

func newReceiver(t *testing.T, secret string, statuses ...int) *receiver {
	r := &receiver{t: t, secret: secret, statuses: statuses}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if got := req.Header.Get("Content-Type"); got != "application/json" {
			t.Errorf("content type %q", got)
		}
		if got, want := req.Header.Get(SignatureHeader), Sign([]byte(r.secret), body); got != want {
			t.Errorf("signature %q, want %q", got, want)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		status := http.StatusOK
		if len(r.statuses) > 0 {
			status, r.statuses = r.statuses[0], r.statuses[1:]
		}
		if status == http.StatusOK {
			var msgs []Message
			if err := json.Unmarshal(body, &msgs); err != nil {
				t.Errorf("body %s: %v", body, err)
			}
			r.posts = append(r.posts, msgs)
			r.bodies = append(r.bodies, body)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) received() [][]Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]Message(nil), r.posts...)
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestFloodIsCoalescedIntoOneMessageWithTheCount(t *testing.T) {
	rcv := newReceiver(t, "s3cret")
	clock := testkit.NewClock(t0)
	n := New(Config{URL: rcv.srv.URL, Secret: "s3cret", Interval: 5 * time.Minute, Now: clock.Now})
	ctx := context.Background()
	for i := range 500 {
		n.Notify(Event{Name: "pingback_result_parked", Provider: "captchaai", FirstAt: t0.Add(time.Duration(i) * time.Millisecond)})
	}
	n.Notify(Event{Name: "pingback_result_parked", Provider: "2captcha"})
	n.collect(clock.Now())
	n.send(ctx, clock.Now())
	if got := rcv.received(); len(got) != 0 {
		t.Fatalf("sent before the gathering second: %v", got)
	}
	clock.Advance(Gather)
	n.collect(clock.Now())
	n.send(ctx, clock.Now())
	got := rcv.received()
	if len(got) != 1 || len(got[0]) != 2 {
		t.Fatalf("posts %v, want one POST of two messages", got)
	}
	byProvider := map[string]Message{}
	for _, m := range got[0] {
		byProvider[m.Provider] = m
	}
	m := byProvider["captchaai"]
	if m.Count != 500 || !m.FirstAt.Equal(t0) || !m.LastAt.Equal(t0.Add(499*time.Millisecond)) || m.Event != "pingback_result_parked" {
		t.Errorf("captchaai message %+v, want count 500 from t0 to t0+499ms", m)
	}
	if byProvider["2captcha"].Count != 1 {
		t.Errorf("2captcha message %+v", byProvider["2captcha"])
	}

	// More of the same within the interval: held until the interval since
	// the last message has passed, then one message.
	for range 30 {
		n.Notify(Event{Name: "pingback_result_parked", Provider: "captchaai"})
	}
	clock.Advance(time.Minute)
	n.collect(clock.Now())
	n.send(ctx, clock.Now())
	if got := rcv.received(); len(got) != 1 {
		t.Fatalf("a second message within the interval: %v", got[1:])
	}
	clock.Advance(4 * time.Minute)
	n.collect(clock.Now())
	n.send(ctx, clock.Now())
	got = rcv.received()
	if len(got) != 2 || len(got[1]) != 1 || got[1][0].Count != 30 {
		t.Fatalf("posts %v, want a second POST with one message of count 30", got)
	}
}

func TestRefusedPostIsRetriedWithBackoff(t *testing.T) {
	rcv := newReceiver(t, "k", http.StatusInternalServerError, http.StatusBadGateway)
	clock := testkit.NewClock(t0)
	n := New(Config{URL: rcv.srv.URL, Secret: "k", Interval: time.Minute, Now: clock.Now})
	ctx := context.Background()
	n.Notify(Event{Name: "pingback_store_unavailable"})
	clock.Advance(Gather)
	step := func() {
		n.collect(clock.Now())
		n.send(ctx, clock.Now())
	}
	step() // 500
	clock.Advance(BackoffMin - time.Millisecond)
	step() // backoff holds: no POST
	rcv.mu.Lock()
	left := len(rcv.statuses)
	rcv.mu.Unlock()
	if left != 1 {
		t.Fatalf("POSTs made during the backoff: %d statuses left, want 1", left)
	}
	clock.Advance(time.Millisecond)
	step() // 502
	clock.Advance(2*BackoffMin - time.Millisecond)
	step()
	if len(rcv.received()) != 0 {
		t.Fatal("retried before the doubled backoff")
	}
	clock.Advance(time.Millisecond)
	step()
	got := rcv.received()
	if len(got) != 1 || len(got[0]) != 1 || got[0][0].Event != "pingback_store_unavailable" || got[0][0].Provider != "" {
		t.Fatalf("posts %v, want the message once after the retries", got)
	}
	if n.Queued() != 0 {
		t.Errorf("%d still queued after a 200", n.Queued())
	}
}

func TestGivenUpAfterADayWithOneLine(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	core, logs := observer.New(zap.WarnLevel)
	clock := testkit.NewClock(t0)
	n := New(Config{URL: srv.URL, Secret: "k", Interval: time.Minute, Now: clock.Now, Logger: zap.New(core)})
	n.Notify(Event{Name: "pingback_route_failing", Provider: "captchaai"})
	clock.Advance(Gather)
	for clock.Now().Before(t0.Add(GiveUpAfter + time.Hour)) {
		n.collect(clock.Now())
		n.send(context.Background(), clock.Now())
		clock.Advance(BackoffMax)
	}
	if n.Queued() != 0 {
		t.Fatalf("%d messages still queued after a day of refusals", n.Queued())
	}
	if got := logs.FilterMessageSnippet("given up").Len(); got != 1 {
		t.Errorf("%d give-up lines, want 1", got)
	}
	if got := logs.FilterMessageSnippet("refused a POST").Len(); got != 1 {
		t.Errorf("%d refusal lines, want 1 (the first of a run)", got)
	}
}

func TestQueueBoundDropsTheOldest(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	clock := testkit.NewClock(t0)
	// Nothing listens on the URL: the messages stay queued.
	n := New(Config{URL: "http://127.0.0.1:1/", Secret: "k", Interval: time.Minute, Now: clock.Now, Logger: zap.New(core)})
	for i := range MaxQueued + 250 {
		n.Notify(Event{Name: "pingback_results_expiring", Provider: "p" + itoa(i)})
	}
	clock.Advance(Gather)
	n.collect(clock.Now())
	if n.Queued() != MaxQueued {
		t.Fatalf("queued %d, want %d", n.Queued(), MaxQueued)
	}
	for range 3 { // more drops within the minute: no new line
		n.Notify(Event{Name: "pingback_results_expiring", Provider: "late" + itoa(int(clock.Now().Unix()))})
		clock.Advance(Gather)
		n.collect(clock.Now())
	}
	if got := logs.FilterMessageSnippet("dropped").Len(); got != 1 {
		t.Errorf("%d drop lines, want 1", got)
	}
	if f := logs.FilterMessageSnippet("dropped").All()[0].ContextMap()["dropped"]; f != int64(250) {
		t.Errorf("first drop line counts %v, want 250", f)
	}
	n.mu.Lock()
	oldest := n.queue[0].msg.Provider
	n.mu.Unlock()
	seen := map[string]bool{}
	for i := range 250 {
		seen["p"+itoa(i)] = true
	}
	if seen[oldest] {
		t.Errorf("the oldest left is %s: the first 250 should have been dropped", oldest)
	}
}

func TestStopEndsTheGoroutine(t *testing.T) {
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(block)
	n := New(Config{URL: srv.URL, Secret: "k", Interval: time.Minute})
	n.tick = 10 * time.Millisecond
	n.Start()
	n.Notify(Event{Name: "pingback_store_unavailable"})
	testkit.WaitFor(t, 5*time.Second, "the POST in flight", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return len(n.queue) == 1 && !n.queue[0].firstTry.IsZero()
	})
	n.Stop() // returns although the POST hangs: Stop cuts it
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// TestLogsNeverCarryTheURLsPathOrQuery: a chat webhook's URL carries its
// credential in the path (Slack's /services/T…/B…/<token>) or the query;
// the notifier's lines name the receiver by scheme and host only, for a
// refused POST, a transport error and a give-up alike.
func TestLogsNeverCarryTheURLsPathOrQuery(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer refusing.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // nothing listens there: a transport error
	for _, base := range []string{refusing.URL, closed.URL} {
		core, logs := observer.New(zap.DebugLevel)
		clock := testkit.NewClock(t0)
		n := New(Config{URL: base + "/services/T0/B0/hooktoken?sig=querytoken", Secret: "k", Interval: time.Minute,
			Now: clock.Now, Logger: zap.New(core)})
		n.Notify(Event{Name: "pingback_route_failing", Provider: "captchaai"})
		clock.Advance(Gather)
		for clock.Now().Before(t0.Add(GiveUpAfter + time.Hour)) {
			n.collect(clock.Now())
			n.send(context.Background(), clock.Now())
			clock.Advance(BackoffMax)
		}
		if logs.Len() < 2 {
			t.Fatalf("%s: %d lines, want the refusal and the give-up", base, logs.Len())
		}
		for _, e := range logs.All() {
			line := e.Message + fmt.Sprint(e.ContextMap())
			if strings.Contains(line, "hooktoken") || strings.Contains(line, "querytoken") {
				t.Errorf("%s: a line carries the URL's path or query: %s", base, line)
			}
			if !strings.Contains(line, strings.TrimPrefix(base, "http://")) {
				t.Errorf("%s: a line does not name the receiver's host: %s", base, line)
			}
		}
	}
}

// blockingCore is a zap core whose writes wait until release is closed,
// telling entered of each: a log sink that stalls (a full pipe).
type blockingCore struct {
	zapcore.LevelEnabler
	entered chan struct{}
	release chan struct{}
}

func (c *blockingCore) With([]zapcore.Field) zapcore.Core { return c }
func (c *blockingCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	return ce.AddCore(e, c)
}
func (c *blockingCore) Write(zapcore.Entry, []zapcore.Field) error {
	c.entered <- struct{}{}
	<-c.release
	return nil
}
func (c *blockingCore) Sync() error { return nil }

// TestNotifyNeverWaitsForALogLine: while the notifier writes one of its
// lines (the queue's drop line, a refusal) to a log sink that stalls,
// Notify, which a pingback's path calls, still returns at once.
func TestNotifyNeverWaitsForALogLine(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer refusing.Close()
	for _, tc := range []struct {
		name  string
		fill  int // events noted before the step, each of its own provider
		which string
	}{
		{"drop line", MaxQueued + 1, "collect"},
		{"refusal line", 1, "send"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core := &blockingCore{LevelEnabler: zapcore.DebugLevel, entered: make(chan struct{}, 1), release: make(chan struct{})}
			clock := testkit.NewClock(t0)
			n := New(Config{URL: refusing.URL, Secret: "k", Now: clock.Now, Logger: zap.New(core)})
			for i := range tc.fill {
				n.Notify(Event{Name: "pingback_result_parked", Provider: itoa(i)})
			}
			clock.Advance(Gather)
			if tc.which == "send" {
				n.collect(clock.Now())
			}
			stepped := make(chan struct{})
			go func() {
				defer close(stepped)
				if tc.which == "collect" {
					n.collect(clock.Now())
				} else {
					n.send(context.Background(), clock.Now())
				}
			}()
			<-core.entered // the line is being written, and stalls
			noted := make(chan struct{})
			go func() {
				defer close(noted)
				n.Notify(Event{Name: "pingback_store_unavailable"})
			}()
			select {
			case <-noted:
			case <-time.After(5 * time.Second):
				t.Error("Notify waited for the notifier's log line")
			}
			close(core.release)
			<-stepped
			<-noted
		})
	}
}
