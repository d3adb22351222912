package pingback

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// pbRoute is one pingback route of a test site: requests to path go through
// a pingback handler for provider (with extra handler lines) to upstream.
type pbRoute struct {
	path, provider, lines, upstream string
}

// routesSite is a site block with one `handle <path>` per route.
func routesSite(routes ...pbRoute) string {
	var b strings.Builder
	fmt.Fprintf(&b, "http://localhost:%s {\n", testHTTPPort)
	for _, r := range routes {
		fmt.Fprintf(&b, "\thandle %s {\n\t\tpingback {\n\t\t\tprovider %s\n", r.path, r.provider)
		if r.lines != "" {
			fmt.Fprintf(&b, "\t\t\t%s\n", r.lines)
		}
		fmt.Fprintf(&b, "\t\t}\n\t\treverse_proxy %s\n\t}\n", r.upstream)
	}
	b.WriteString("}\n")
	return b.String()
}

// doRequest sends req (with the given client, else the default one) and returns
// the status, the body and the response headers.
func doRequest(t *testing.T, req *http.Request, client ...*http.Client) (int, string, http.Header) {
	t.Helper()
	c := http.DefaultClient
	if len(client) > 0 {
		c = client[0]
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading answer: %v", req.Method, req.URL, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// newTestRequest builds a request to the test server; body may be nil.
func newTestRequest(t *testing.T, method, target, contentType string, body []byte) *http.Request {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, testBase+target, rd)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return req
}

// assertNotStored checks that the running store has no record under key.
func assertNotStored(t *testing.T, provider, id string) {
	t.Helper()
	st := runningApp(t).store(time.Second)
	if st == nil {
		t.Fatal("store not open")
	}
	rec, err := st.Get(context.Background(), store.Key{Provider: provider, ID: id})
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("%s:%q: want ErrNotFound, got record %+v, error %v", provider, id, rec, err)
	}
}

// waitState waits until the record exists and has left state forwarding,
// and returns it.
func waitState(t *testing.T, provider, id string) *store.Record {
	t.Helper()
	st := runningApp(t).store(time.Second)
	var rec *store.Record
	testkit.WaitFor(t, 5*time.Second, "the outcome of "+provider+":"+id, func() bool {
		r, err := st.Get(context.Background(), store.Key{Provider: provider, ID: id})
		if err != nil || r.State == store.StateForwarding {
			return false
		}
		rec = r
		return true
	})
	return rec
}

// forwardedHeaders are the headers reverse_proxy itself adds to what the
// provider sent.
var forwardedHeaders = []string{"Via", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// receiveCase is one pingback sent as a provider would (method, target,
// content type and body) and the task id and code it must be stored with.
type receiveCase struct {
	name        string
	provider    string
	method      string
	target      string
	contentType string
	body        []byte
	id, code    string
}

// TestReceiveForms checks that each legacy pingback form is stored and
// reaches the app exactly as the provider sent it, plus the three delivery
// headers; an error string as code is an ordinary result.
func TestReceiveForms(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", routesSite(
		pbRoute{"/captchaai", "captchaai", "", app.HostPort()},
		pbRoute{"/2captcha", "2captcha", "", app.HostPort()},
		pbRoute{"/rucaptcha", "rucaptcha", "", app.HostPort()},
	))
	mpType, mpBody := testkit.Multipart(t, nil, "id", "3003", "code", "03AGdBq2")

	tests := []receiveCase{
		{name: "GET query", provider: "captchaai", method: http.MethodGet,
			target: "/captchaai?id=1001&code=03AGdBq24PBC%2Bx_y", id: "1001", code: "03AGdBq24PBC+x_y"},
		{name: "POST urlencoded", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha?tag=a%2Fb", contentType: "application/x-www-form-urlencoded",
			body: []byte("id=2002&code=03AGdBq25%3D%3D"), id: "2002", code: "03AGdBq25=="},
		{name: "POST multipart", provider: "rucaptcha", method: http.MethodPost,
			target: "/rucaptcha", contentType: mpType, body: mpBody, id: "3003", code: "03AGdBq2"},
		{name: "error string as code", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha", contentType: "application/x-www-form-urlencoded",
			body: []byte("id=4004&code=ERROR_CAPTCHA_UNSOLVABLE"), id: "4004", code: "ERROR_CAPTCHA_UNSOLVABLE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newTestRequest(t, tc.method, tc.target, tc.contentType, tc.body)
			req.Header.Set("User-Agent", "solver-pingback/1.0")
			req.Header.Set("Accept-Encoding", "identity")
			req.Header.Add("X-Solver-Trace", "first")
			req.Header.Add("X-Solver-Trace", "second")
			sent := req.Header.Clone()
			if tc.body != nil {
				sent.Set("Content-Length", fmt.Sprint(len(tc.body)))
			}

			status, body, _ := doRequest(t, req)
			if status != http.StatusOK || body != "OK" {
				t.Fatalf("provider got %d %q, want 200 \"OK\"", status, body)
			}
			key := tc.provider + ":" + tc.id
			testkit.WaitFor(t, 5*time.Second, "the app to receive "+key, func() bool { return app.Count(key) == 1 })

			var seen testkit.Received
			for _, r := range app.Requests() {
				if r.Header.Get(HeaderIdempotencyKey) == key {
					seen = r
				}
			}
			if seen.Method != tc.method || seen.URI != tc.target || seen.Host != "localhost:"+testHTTPPort {
				t.Errorf("app saw %s %s Host %s, want %s %s Host localhost:%s",
					seen.Method, seen.URI, seen.Host, tc.method, tc.target, testHTTPPort)
			}
			if seen.Body != string(tc.body) {
				t.Errorf("app saw body %q, want %q", seen.Body, tc.body)
			}
			for name, want := range sent {
				if got := seen.Header.Values(name); !slices.Equal(got, want) {
					t.Errorf("app saw %s %q, want %q", name, got, want)
				}
			}
			for name, want := range map[string]string{HeaderIdempotencyKey: key, HeaderSource: "callback", HeaderAttempt: "1", HeaderVerified: "none", HeaderTracked: "false"} {
				if got := seen.Header.Values(name); !slices.Equal(got, []string{want}) {
					t.Errorf("app saw %s %q, want %q", name, got, want)
				}
			}
			for name := range seen.Header {
				if sent[name] == nil && !slices.Contains(forwardedHeaders, name) &&
					name != HeaderIdempotencyKey && name != HeaderSource && name != HeaderAttempt && name != HeaderVerified && name != HeaderTracked &&
					name != HeaderReceivedAt {
					t.Errorf("app saw an extra header %s: %q", name, seen.Header[name])
				}
			}

			rec := waitState(t, tc.provider, tc.id)
			if rec.State != store.StateDelivered || rec.Code != tc.code || rec.Source != "callback" || rec.Attempts != 1 {
				t.Errorf("record: state %s, code %q, source %s, attempts %d; want delivered, %q, callback, 1",
					rec.State, rec.Code, rec.Source, rec.Attempts, tc.code)
			}
			if rec.Request.Method != tc.method || rec.Request.URI != tc.target || string(rec.Request.Body) != string(tc.body) {
				t.Errorf("stored request %s %s %q, want %s %s %q",
					rec.Request.Method, rec.Request.URI, rec.Request.Body, tc.method, tc.target, tc.body)
			}
		})
	}
}

// TestRejectBadInput checks that an invalid pingback gets its status and a
// short plain-text reason, and is neither stored nor forwarded.
func TestRejectBadInput(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "max_body 1KiB", app))
	const form = "application/x-www-form-urlencoded"
	big := []byte("id=5007&code=" + strings.Repeat("x", 2048))
	mpType, mpBody := testkit.Multipart(t, nil, "id", "5013", "code", "T")

	tests := []struct {
		name        string
		method      string
		target      string
		contentType string
		body        []byte
		chunked     bool
		ids         []string // must not be stored
		status      int
		reason      string
	}{
		{name: "id with letters", method: "GET", target: "/cb?id=12ab&code=T",
			ids: []string{"12ab"}, status: 400, reason: "malformed id"},
		{name: "id of 33 digits", method: "GET", target: "/cb?id=" + strings.Repeat("7", 33) + "&code=T",
			ids: []string{strings.Repeat("7", 33)}, status: 400, reason: "malformed id"},
		{name: "empty id", method: "GET", target: "/cb?id=&code=T",
			ids: []string{""}, status: 400, reason: "id"},
		{name: "missing id", method: "GET", target: "/cb?code=T",
			ids: []string{""}, status: 400, reason: "missing id"},
		{name: "missing code", method: "GET", target: "/cb?id=5001",
			ids: []string{"5001"}, status: 400, reason: "missing code"},
		{name: "empty code", method: "POST", target: "/cb", contentType: form, body: []byte("id=5002&code="),
			ids: []string{"5002"}, status: 400, reason: "missing code"},
		{name: "repeated id in query", method: "GET", target: "/cb?id=5003&id=5004&code=T",
			ids: []string{"5003", "5004"}, status: 400, reason: "more than one id"},
		{name: "repeated id in form", method: "POST", target: "/cb", contentType: form, body: []byte("id=5005&id=5005&code=T"),
			ids: []string{"5005"}, status: 400, reason: "more than one id"},
		{name: "body over max_body", method: "POST", target: "/cb", contentType: form, body: big,
			ids: []string{"5007"}, status: 413, reason: "body too large"},
		{name: "chunked body over max_body", method: "POST", target: "/cb", contentType: form, body: big, chunked: true,
			ids: []string{"5007"}, status: 413, reason: "body too large"},
		{name: "PUT", method: "PUT", target: "/cb?id=5008&code=T",
			ids: []string{"5008"}, status: 405, reason: "method not allowed"},
		{name: "DELETE", method: "DELETE", target: "/cb?id=5009&code=T",
			ids: []string{"5009"}, status: 405, reason: "method not allowed"},
		{name: "JSON body", method: "POST", target: "/cb?id=5010&code=T", contentType: "application/json",
			body: []byte(`{"id":"5011","code":"T"}`), ids: []string{"5010", "5011"}, status: 415, reason: "unsupported Content-Type"},
		{name: "text body", method: "POST", target: "/cb?id=5012&code=T", contentType: "text/plain",
			body: []byte("id=5012&code=T"), ids: []string{"5012"}, status: 415, reason: "unsupported Content-Type"},
		{name: "multipart without boundary", method: "POST", target: "/cb", contentType: "multipart/form-data",
			body: mpBody, ids: []string{"5013"}, status: 400, reason: "boundary"},
		{name: "multipart with a wrong boundary", method: "POST", target: "/cb",
			contentType: strings.Replace(mpType, "boundary=", "boundary=zz", 1),
			body:        mpBody, ids: []string{"5013"}, status: 400, reason: "malformed multipart"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newTestRequest(t, tc.method, tc.target, tc.contentType, tc.body)
			if tc.chunked {
				req.Body = io.NopCloser(io.MultiReader(bytes.NewReader(tc.body)))
				req.ContentLength = -1
			}
			status, body, header := doRequest(t, req)
			if status != tc.status || !strings.Contains(body, tc.reason) {
				t.Errorf("got %d %q, want %d with a reason containing %q", status, body, tc.status, tc.reason)
			}
			if ct := header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
				t.Errorf("Content-Type %q, want text/plain", ct)
			}
			if len(body) > 120 || strings.Contains(body, "\n") {
				t.Errorf("reason %q is not short plain text", body)
			}
			if status == http.StatusMethodNotAllowed && header.Get("Allow") != "GET, POST" {
				t.Errorf("Allow %q, want \"GET, POST\"", header.Get("Allow"))
			}
			for _, id := range tc.ids {
				assertNotStored(t, "captchaai", id)
			}
			// The forward would have run before the answer.
			if n := len(app.Requests()); n != 0 {
				t.Errorf("the app received %d requests, want none", n)
			}
		})
	}

	// A valid pingback after them all is the only thing the app gets.
	if status, body := testkit.Get(t, testBase+"/cb?id=5999&code=T"); status != http.StatusOK || body != "OK" {
		t.Fatalf("valid pingback got %d %q, want 200 \"OK\"", status, body)
	}
	testkit.WaitFor(t, 5*time.Second, "the valid pingback", func() bool { return app.Count("captchaai:5999") == 1 })
	if n := len(app.Requests()); n != 1 {
		t.Errorf("the app received %d requests, want only the valid one", n)
	}
}

// TestDedupeSequential checks that a re-delivery of a known id, with the
// same or a different code, gets 200 "OK" and is never forwarded again,
// whatever state the first delivery ended in.
func TestDedupeSequential(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\tbackoff 1m 10m\n}", pingbackSite("captchaai", "", app))

	tests := []struct {
		name      string
		appStatus int
		id        string
		state     store.State
	}{
		{"first delivered", 200, "6001", store.StateDelivered},
		{"first rejected", 422, "6002", store.StateRejected},
		{"first failed", 503, "6003", store.StateFailed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			app.SetStatus(tc.appStatus)
			key := "captchaai:" + tc.id
			if status, body := testkit.Get(t, testBase+"/cb?id="+tc.id+"&code=FIRST"); status != 200 || body != "OK" {
				t.Fatalf("first delivery got %d %q, want 200 \"OK\"", status, body)
			}
			if rec := waitState(t, "captchaai", tc.id); rec.State != tc.state {
				t.Fatalf("state %s, want %s", rec.State, tc.state)
			}
			app.SetStatus(200)
			for _, code := range []string{"FIRST", "SECOND"} {
				if status, body := testkit.Get(t, testBase+"/cb?id="+tc.id+"&code="+code); status != 200 || body != "OK" {
					t.Errorf("re-delivery with code %s got %d %q, want 200 \"OK\"", code, status, body)
				}
			}
			if status, body := testkit.PostForm(t, testBase+"/cb", "id="+tc.id+"&code=THIRD"); status != 200 || body != "OK" {
				t.Errorf("re-delivery by POST got %d %q, want 200 \"OK\"", status, body)
			}
			// A later pingback reaching the app shows the re-deliveries
			// had their chance to be forwarded.
			barrier := tc.id + "9"
			testkit.Get(t, testBase+"/cb?id="+barrier+"&code=T")
			testkit.WaitFor(t, 5*time.Second, "the barrier pingback", func() bool { return app.Count("captchaai:"+barrier) == 1 })
			if n := app.Count(key); n != 1 {
				t.Errorf("the app received %s %d times, want once", key, n)
			}
			rec := getRecord(t, "captchaai", tc.id)
			if rec.Code != "FIRST" || rec.State != tc.state || rec.Attempts != 1 {
				t.Errorf("record: code %q, state %s, attempts %d; want FIRST, %s, 1", rec.Code, rec.State, rec.Attempts, tc.state)
			}
		})
	}
}

// TestDedupeConcurrent delivers one id 50 times at once: every delivery
// gets 200 "OK" and the app receives it exactly once.
func TestDedupeConcurrent(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	const n = 50
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer client.CloseIdleConnections()

	start := make(chan struct{})
	type answer struct {
		status int
		body   string
		err    error
	}
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			form := fmt.Sprintf("id=7001&code=TOKEN%d", i%2)
			resp, err := client.Post(testBase+"/cb", "application/x-www-form-urlencoded", strings.NewReader(form))
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers <- answer{resp.StatusCode, string(b), err}
		}()
	}
	close(start)
	wg.Wait()
	close(answers)
	for a := range answers {
		if a.err != nil || a.status != http.StatusOK || a.body != "OK" {
			t.Errorf("a delivery got %d %q (error %v), want 200 \"OK\"", a.status, a.body, a.err)
		}
	}
	if rec := waitState(t, "2captcha", "7001"); rec.State != store.StateDelivered || rec.Attempts != 1 {
		t.Errorf("record: state %s, attempts %d; want delivered, 1", rec.State, rec.Attempts)
	}
	testkit.Get(t, testBase+"/cb?id=7002&code=T")
	testkit.WaitFor(t, 5*time.Second, "the barrier pingback", func() bool { return app.Count("2captcha:7002") == 1 })
	if got := app.Count("2captcha:7001"); got != 1 {
		t.Errorf("the app received the id %d times, want exactly once", got)
	}
}

// TestForwardOutcomes checks how the app's answer classifies the record,
// while the provider always gets 200 "OK".
func TestForwardOutcomes(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\tbackoff 1m 10m\n}", routesSite(
		pbRoute{"/cb", "captchaai", "", app.HostPort()},
		pbRoute{"/down", "captchaai", "", "127.0.0.1:" + testkit.UnusedLoopbackPort(t)},
	))

	tests := []struct {
		name      string
		path      string
		appStatus int
		state     store.State
		status    int // recorded as LastStatus
	}{
		{"200", "/cb", 200, store.StateDelivered, 200},
		{"302", "/cb", 302, store.StateDelivered, 302},
		{"500", "/cb", 500, store.StateFailed, 500},
		{"503", "/cb", 503, store.StateFailed, 503},
		{"408", "/cb", 408, store.StateFailed, 408},
		{"429", "/cb", 429, store.StateFailed, 429},
		{"refused connection", "/down", 200, store.StateFailed, 502},
		{"400", "/cb", 400, store.StateRejected, 400},
		{"404", "/cb", 404, store.StateRejected, 404},
		{"422", "/cb", 422, store.StateRejected, 422},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			app.SetStatus(tc.appStatus)
			id := fmt.Sprint(8000 + i)
			if status, body := testkit.Get(t, testBase+tc.path+"?id="+id+"&code=T"); status != 200 || body != "OK" {
				t.Fatalf("provider got %d %q, want 200 \"OK\"", status, body)
			}
			rec := waitState(t, "captchaai", id)
			if rec.State != tc.state || rec.LastStatus != tc.status {
				t.Errorf("state %s, last status %d; want %s, %d", rec.State, rec.LastStatus, tc.state, tc.status)
			}
			switch tc.state {
			case store.StateFailed:
				if !rec.DueAt.After(rec.UpdatedAt) {
					t.Errorf("a retryable failure needs a retry time after %s, got DueAt %s", rec.UpdatedAt, rec.DueAt)
				}
				if rec.LastError == "" {
					t.Error("a failure needs a last_error")
				}
			default:
				if !rec.DueAt.IsZero() {
					t.Errorf("a %s record must not be due again, got DueAt %s", rec.State, rec.DueAt)
				}
			}
		})
	}
}

// TestSlowApp checks that the provider gets 200 "OK" within ack_timeout
// when the app is slower, and that the forward still completes and is
// recorded.
func TestSlowApp(t *testing.T) {
	app := newAppStub(t)
	release := make(chan struct{})
	app.Tune(func() { app.Release = release })
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	const ackTimeout = 200 * time.Millisecond
	startCaddy(t, "", pingbackSite("captchaai", "ack_timeout 200ms", app))

	// The app answers only once released, so without the handler's own
	// answer this request would time out.
	client := &http.Client{Timeout: 5 * time.Second}
	begin := time.Now()
	status, body, _ := doRequest(t, newTestRequest(t, http.MethodGet, "/cb?id=9001&code=T", "", nil), client)
	took := time.Since(begin)
	if status != http.StatusOK || body != "OK" {
		t.Fatalf("provider got %d %q, want 200 \"OK\"", status, body)
	}
	if took > ackTimeout+800*time.Millisecond {
		t.Errorf("provider waited %s, want about ack_timeout (%s)", took, ackTimeout)
	}
	testkit.WaitFor(t, 5*time.Second, "the app to receive the pingback", func() bool { return app.Count("captchaai:9001") == 1 })
	if rec := getRecord(t, "captchaai", "9001"); rec.State != store.StateForwarding {
		t.Fatalf("state %s while the app still works on it, want forwarding", rec.State)
	}
	close(release)
	released = true
	if rec := waitState(t, "captchaai", "9001"); rec.State != store.StateDelivered || rec.LastStatus != 200 {
		t.Errorf("state %s, last status %d; want delivered, 200", rec.State, rec.LastStatus)
	}
	if n := app.Count("captchaai:9001"); n != 1 {
		t.Errorf("the app received the pingback %d times, want once", n)
	}
}

// counterValue reads a Prometheus counter.
func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestCommitFailure checks that with the store unable to commit the
// handler still forwards, answers 200 only if the app accepted the result
// (503 otherwise), and stores nothing.
func TestCommitFailure(t *testing.T) {
	app := newAppStub(t)
	dir := startCaddy(t, "", pingbackSite("rucaptcha", "", app))
	if err := runningApp(t).store(time.Second).Close(); err != nil {
		t.Fatalf("closing the store: %v", err)
	}
	// The counters are process-wide: compare before and after.
	storedBefore := counterValue(t, theMetrics.callbacks.WithLabelValues("rucaptcha", "stored"))
	failedBefore := counterValue(t, theMetrics.callbacks.WithLabelValues("rucaptcha", "store_error"))

	tests := []struct {
		id        string
		appStatus int
		status    int
		body      string
	}{
		{"9101", 200, 200, "OK"},
		{"9102", 503, 503, ""},
	}
	for _, tc := range tests {
		app.SetStatus(tc.appStatus)
		status, body := testkit.PostForm(t, testBase+"/cb", "id="+tc.id+"&code=T")
		if status != tc.status || (tc.body != "" && body != tc.body) {
			t.Errorf("app answered %d: provider got %d %q, want %d %q", tc.appStatus, status, body, tc.status, tc.body)
		}
		if n := app.Count("rucaptcha:" + tc.id); n != 1 {
			t.Errorf("app answered %d: the app received the pingback %d times, want once", tc.appStatus, n)
		}
	}

	if d := counterValue(t, theMetrics.callbacks.WithLabelValues("rucaptcha", "stored")) - storedBefore; d != 0 {
		t.Errorf("%v results counted as stored, want none", d)
	}
	if d := counterValue(t, theMetrics.callbacks.WithLabelValues("rucaptcha", "store_error")) - failedBefore; d != float64(len(tests)) {
		t.Errorf("%v results counted as store errors, want %d", d, len(tests))
	}

	// Nothing reached the disk: reopen the database once Caddy let go of it.
	unloadCaddy(t)
	st, err := badgerstore.Open(badgerstore.Options{Dir: dir})
	if err != nil {
		t.Fatalf("reopening the store: %v", err)
	}
	defer st.Close()
	for _, tc := range tests {
		if rec, err := st.Get(context.Background(), store.Key{Provider: "rucaptcha", ID: tc.id}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("id %s: want ErrNotFound, got record %+v, error %v", tc.id, rec, err)
		}
	}
}

// TestReceiveLenientForms: pingbacks that Go's url.ParseQuery refuses but
// PHP and Node accept (a ';' in a value, malformed '%' escapes, bytes that
// are not UTF-8) are answered 200 "OK", stored with the code as PHP reads
// it, and reach the app byte-identical: body and RequestURI as sent.
func TestReceiveLenientForms(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", routesSite(
		pbRoute{"/captchaai", "captchaai", "", app.HostPort()},
		pbRoute{"/2captcha", "2captcha", "", app.HostPort()},
	))
	const form = "application/x-www-form-urlencoded"
	mpType, mpBody := testkit.Multipart(t, nil, "id", "7105", "code", "x=1,y=2;x=3,y=4")

	tests := []receiveCase{
		{name: "semicolon in a POST body", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha", contentType: form,
			body: []byte("id=7101&code=x=1,y=2;x=3,y=4"), id: "7101", code: "x=1,y=2;x=3,y=4"},
		{name: "semicolon in a GET query", provider: "captchaai", method: http.MethodGet,
			target: "/captchaai?id=7102&code=x=1,y=2;x=3,y=4", id: "7102", code: "x=1,y=2;x=3,y=4"},
		{name: "semicolon in the query of a POST", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha?tag=a;b", contentType: form,
			body: []byte("id=7103&code=a;b"), id: "7103", code: "a;b"},
		{name: "plus, escapes and malformed escapes in a query", provider: "captchaai", method: http.MethodGet,
			target: "/captchaai?id=7104&code=a+b%2B%3B%zz%4%", id: "7104", code: "a b+;%zz%4%"},
		{name: "semicolon in the query of a multipart POST", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha?tag=a;b", contentType: mpType, body: mpBody, id: "7105", code: "x=1,y=2;x=3,y=4"},
		{name: "raw and escaped bytes that are not UTF-8", provider: "2captcha", method: http.MethodPost,
			target: "/2captcha", contentType: form,
			body: []byte("id=7106&code=\xff\xfe;%FF%80\x00+%"), id: "7106", code: "\xff\xfe;\xff\x80\x00 %"},
		{name: "raw bytes that are not UTF-8 in a query", provider: "captchaai", method: http.MethodGet,
			target: "/captchaai?id=7107&code=\xff;x", id: "7107", code: "\xff;x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newTestRequest(t, tc.method, tc.target, tc.contentType, tc.body)
			status, body, _ := doRequest(t, req)
			if status != http.StatusOK || body != "OK" {
				t.Fatalf("provider got %d %q, want 200 \"OK\"", status, body)
			}
			key := tc.provider + ":" + tc.id
			testkit.WaitFor(t, 5*time.Second, "the app to receive "+key, func() bool { return app.Count(key) == 1 })
			for _, seen := range app.Requests() {
				if seen.Header.Get(HeaderIdempotencyKey) != key {
					continue
				}
				if seen.Method != tc.method || seen.URI != tc.target {
					t.Errorf("app saw %s %q, want %s %q", seen.Method, seen.URI, tc.method, tc.target)
				}
				if seen.Body != string(tc.body) {
					t.Errorf("app saw body %q, want %q", seen.Body, tc.body)
				}
			}
			rec := waitState(t, tc.provider, tc.id)
			if rec.State != store.StateDelivered || rec.Code != storedString(tc.code) {
				t.Errorf("record: state %s, code %q; want delivered, %q", rec.State, rec.Code, storedString(tc.code))
			}
			if rec.Request.URI != storedString(tc.target) || string(rec.Request.Body) != string(tc.body) {
				t.Errorf("stored request %q %q, want %q %q", rec.Request.URI, rec.Request.Body, storedString(tc.target), tc.body)
			}
		})
	}
}

// storedString is s as the store gives it back in a string field of a
// record (Code, Request.URI, header values).
//
// The store keeps string fields byte for byte (its binary encoding; the
// JSON of format 2 coerced bytes that are not UTF-8 to U+FFFD), so the
// stored code and URI are what arrived, and a replay sends the same URI.
func storedString(s string) string { return s }

func TestSmokeCallbackReachesApp(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "", app))
	status, body := testkit.Get(t, testBase+"/cb?id=42&code=TOKEN")
	if status != http.StatusOK || body != "OK" {
		t.Fatalf("got %d %q, want 200 OK", status, body)
	}
	testkit.WaitFor(t, 5*time.Second, "the app to receive the callback", func() bool { return app.Count("captchaai:42") == 1 })
	testkit.WaitFor(t, 5*time.Second, "delivered state", func() bool { return getRecord(t, "captchaai", "42").State == store.StateDelivered })
}

// TestJSONCallbacksReachTheApp: callbacks that do come (anti-captcha's JSON
// with a numeric taskId, CapSolver's with a string one, 2captcha v2's form)
// are stored and forwarded byte-identical, and the task is done (no poll).
func TestJSONCallbacksReachTheApp(t *testing.T) {
	for _, tc := range []struct{ provider, flavor string }{
		{"anticaptcha", captchasim.FlavorAntiCaptcha},
		{"capsolver", captchasim.FlavorCapSolver},
		{"2captcha", captchasim.Flavor2Captcha},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			sim := newJSONSim(t, captchasim.Config{JSONFlavor: tc.flavor, SolveMin: 100 * time.Millisecond, SolveMax: 200 * time.Millisecond})
			startJSONCaddy(t, tc.provider, pollBlock("after 30s"), sim, app, "")
			id := createTask(t, tc.provider)
			key := tc.provider + ":" + id
			testkit.WaitFor(t, 10*time.Second, "the callback", func() bool { return len(deliveriesOf(app, key)) == 1 })
			d := deliveriesOf(app, key)[0]
			if d.Header.Get(HeaderSource) != "callback" {
				t.Errorf("source %q", d.Header.Get(HeaderSource))
			}
			rec := getRecord(t, tc.provider, id)
			if string(rec.Request.Body) != d.Body {
				t.Errorf("app got %q, the provider sent %q", d.Body, rec.Request.Body)
			}
			task, err := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: tc.provider, ID: id})
			if err != nil || task.State != store.TaskDone {
				t.Errorf("task %+v, %v; want done", task, err)
			}
			if tc.flavor == captchasim.Flavor2Captcha {
				return // a form callback has no getTaskResult shape: passed through
			}
			// Local getTaskResult for a result that came by callback.
			calls := sim.Stats().GetTaskResultCalls
			idJSON, _ := json.Marshal(id)
			if tc.flavor != captchasim.FlavorCapSolver {
				idJSON = []byte(id)
			}
			local := jsonCall(t, tc.provider, "getTaskResult", `{"clientKey":"`+captchasim.DefaultKey+`","taskId":`+string(idJSON)+`}`)
			if string(local.body) != string(rec.Answer) || sim.Stats().GetTaskResultCalls != calls {
				t.Errorf("local getTaskResult %q, want the callback's body %q without asking the provider", local.body, rec.Answer)
			}
		})
	}
}

// TestAckTimeoutDefaults: with an app that does not answer, the provider's
// callback is answered 200 at the provider's default ack_timeout: 1s for
// the anti-captcha family, which closes the connection at 2 s, 2s for the
// others.
func TestAckTimeoutDefaults(t *testing.T) {
	for _, tc := range []struct {
		provider, body, ctype string
		want                  time.Duration
	}{
		{"anticaptcha", `{"taskId":7100,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`, "application/json", time.Second},
		{"capmonster", `{"taskId":7101,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`, "application/json", time.Second},
		{"capsolver", `{"taskId":"ab-7102","errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`, "application/json", 2 * time.Second},
		{"2captcha", `id=7103&code=T`, "application/x-www-form-urlencoded", 2 * time.Second},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			release := make(chan struct{})
			app.Tune(func() { app.Release = release })
			defer close(release)
			startJSONCaddy(t, tc.provider, "", &jsonSim{url: "http://127.0.0.1:1"}, app, "")
			start := time.Now()
			resp := trkDo(t, http.MethodPost, "/cb/"+tc.provider, tc.ctype, strings.NewReader(tc.body))
			took := time.Since(start)
			if resp.status != http.StatusOK || string(resp.body) != "OK" {
				t.Fatalf("answered %d %q", resp.status, resp.body)
			}
			if took < tc.want || took > tc.want+900*time.Millisecond {
				t.Errorf("answered after %s, want at the default ack_timeout %s", took, tc.want)
			}
		})
	}
}

// TestAckTimeoutCountsFromBodyEnd: ack_timeout counts from the request
// body's last byte, not from the request's first. A capmonster pingback
// uploaded over a raw TCP connection a few bytes at a time, the upload
// three times longer than the route's ack_timeout (a provider on a slow
// link), is answered 200 once committed, stored once and delivered once.
// If its commit then takes longer than ack_timeout, it is answered 503
// "result not stored" ack_timeout after its last byte (not at once), and
// delivered once the commit is done.
func TestAckTimeoutCountsFromBodyEnd(t *testing.T) {
	const ack = 400 * time.Millisecond
	var gate atomic.Pointer[chan struct{}] // when set, commits wait until it is closed
	commitFaults := func(o *badgerstore.Options) {
		o.BeforeCommit = func(uint64) error {
			if g := gate.Load(); g != nil {
				<-*g
			}
			return nil
		}
	}
	app := newAppStub(t)
	startCaddyWith(t, commitFaults, "", pingbackSite("capmonster", "ack_timeout "+ack.String(), app))
	stored := runningApp(t).metrics.callbacks.WithLabelValues("capmonster", "stored")

	for _, tc := range []struct {
		name, id   string
		holdCommit bool // the commit waits until the answer is read
		status     int
		answer     string
	}{
		{"commit in time", "7201", false, http.StatusOK, "OK"},
		{"commit slower than ack_timeout", "7202", true, http.StatusServiceUnavailable, "result not stored"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "capmonster:" + tc.id
			before := testutil.ToFloat64(stored)
			unhold := func() {}
			if tc.holdCommit {
				g := make(chan struct{})
				gate.Store(&g)
				unhold = sync.OnceFunc(func() { gate.Store(nil); close(g) })
				t.Cleanup(unhold) // never left held when the case fails
			}
			body := `{"taskId":` + tc.id + `,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T-` + tc.id + `"}}`
			got := slowUpload(t, "/cb", "application/json", body, 24, 3*ack)
			if got.upload < 2*ack {
				t.Fatalf("the upload took %s, not clearly longer than ack_timeout %s: the case shows nothing", got.upload, ack)
			}
			late := got.answered.Sub(got.lastByte)
			if got.status != tc.status || got.body != tc.answer {
				t.Errorf("after an upload of %s, answered %d %q %s after the last byte; want %d %q",
					got.upload, got.status, got.body, late, tc.status, tc.answer)
			}
			if tc.holdCommit && (late < ack || late > ack+time.Second) {
				t.Errorf("the held commit was answered %s after the last byte, want at ack_timeout %s after it", late, ack)
			}
			unhold()
			var rec *store.Record
			testkit.WaitFor(t, 5*time.Second, key+" to be committed and delivered", func() bool {
				var err error
				rec, err = runningApp(t).store(time.Second).Get(context.Background(), store.Key{Provider: "capmonster", ID: tc.id})
				return err == nil && rec.State == store.StateDelivered
			})
			if rec.Attempts != 1 || app.Count(key) != 1 || app.Deliveries(key) != 1 {
				t.Errorf("%d attempts, the app received it %d times and took it %d times; want once each",
					rec.Attempts, app.Count(key), app.Deliveries(key))
			}
			if n := testutil.ToFloat64(stored) - before; n != 1 {
				t.Errorf("callbacks_total{capmonster,stored} rose by %v, want 1", n)
			}
		})
	}
}

// slowAnswer is what slowUpload saw.
type slowAnswer struct {
	status   int
	body     string
	upload   time.Duration // from the request line to the body's last piece
	lastByte time.Time     // just before the body's last piece was written
	answered time.Time     // when the answer's status line and headers were read
}

// slowUpload POSTs body to path on the in-process Caddy over a raw TCP
// connection: the request line and headers at once, then the body in
// pieces of a few bytes, one every over/pieces (the pauses shape the
// upload; they synchronise nothing), and reads the answer.
func slowUpload(t *testing.T, path, ctype, body string, pieces int, over time.Duration) slowAnswer {
	t.Helper()
	conn, err := net.Dial("tcp", "localhost:"+testHTTPPort)
	if err != nil {
		t.Fatalf("dialling Caddy: %v", err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(over + 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: localhost:%s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		path, testHTTPPort, ctype, len(body))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatalf("writing the request's head: %v", err)
	}
	var a slowAnswer
	step := max(1, (len(body)+pieces-1)/pieces)
	for i := 0; i < len(body); i += step {
		time.Sleep(over / time.Duration(pieces))
		a.lastByte = time.Now()
		if _, err := io.WriteString(conn, body[i:min(i+step, len(body))]); err != nil {
			t.Fatalf("writing the body at byte %d: %v", i, err)
		}
	}
	a.upload = a.lastByte.Sub(start)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	a.answered = time.Now()
	if err != nil {
		t.Fatalf("reading the answer after an upload of %s: %v", a.upload, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer's body: %v", err)
	}
	a.status, a.body = resp.StatusCode, string(b)
	return a
}

// TestInvalidUTF8CodeDuplicate sends a pingback whose code is not valid
// UTF-8 twice: it is stored byte for byte and the second is a duplicate,
// not a conflict.
func TestInvalidUTF8CodeDuplicate(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	m := runningApp(t).metrics.callbacks
	dup, conflict := testutil.ToFloat64(m.WithLabelValues("2captcha", "duplicate")), testutil.ToFloat64(m.WithLabelValues("2captcha", "conflict"))
	for range 2 {
		if s, b := testkit.PostForm(t, testBase+"/cb", "id=5150&code=%FF%FE%C3%28ok%80"); s != 200 {
			t.Fatalf("pingback: %d %s", s, b)
		}
	}
	if got := getRecord(t, "2captcha", "5150").Code; got != "\xff\xfe\xc3\x28ok\x80" {
		t.Errorf("stored code %q, want the bytes sent", got)
	}
	if d := testutil.ToFloat64(m.WithLabelValues("2captcha", "duplicate")) - dup; d != 1 {
		t.Errorf("duplicates grew by %v, want 1", d)
	}
	if d := testutil.ToFloat64(m.WithLabelValues("2captcha", "conflict")) - conflict; d != 0 {
		t.Errorf("conflicts grew by %v, want 0", d)
	}
	if n := app.Count("2captcha:5150"); n != 1 {
		t.Errorf("the app got it %d times, want once", n)
	}
}
