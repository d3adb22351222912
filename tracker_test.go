package pingback

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// trkKey is the API key the apps of these tests send; the recording
// provider does not check it.
const trkKey = "5157cafe5157cafe5157cafe5157cafe"

// trkAccounts are the accounts the tasks of these tests can have: trkKey's
// (the pinned account id: the first 8 bytes, hex, of HMAC-SHA256 keyed
// with the key over "caddy-pingback account v1 <provider>") and none.
var trkAccounts = func() []store.Account {
	m := hmac.New(sha256.New, []byte(trkKey))
	m.Write([]byte("caddy-pingback account v1 2captcha"))
	return []store.Account{{Provider: "2captcha", ID: hex.EncodeToString(m.Sum(nil)[:8])}, {Provider: "2captcha"}}
}()

// trkAfter is the fixed poll `after` of these tests' configs: a tracked
// task's first poll is due trkAfter past its submission. It is long enough
// that no task becomes due while a test runs.
const trkAfter = 30 * time.Second

// trkGlobal is the global pingback block of these tests.
// The provider block gives the tracker the account's key, which res.php
// callers must present to be answered locally; its endpoint refuses
// connections, so no test can reach the real provider.
var trkGlobal = fmt.Sprintf("provider 2captcha {\n\t\t\tendpoint http://127.0.0.1:1\n\t\t\tapi_key %s\n\t\t}\n\t\tpoll {\n\t\t\tafter %s\n\t\t}", trkKey, trkAfter)

// trkCallbackURL is the pingback route of the test site.
var trkCallbackURL = testBase + "/cb"

// trkSeen is a request as the recording provider received it: the exact
// query, headers and body bytes, and the parameters it parsed from them.
type trkSeen struct {
	Method   string
	Path     string
	RawQuery string
	Header   http.Header
	Body     []byte
	Form     url.Values // query and body fields, as the provider reads them
	File     []byte     // the multipart "file" part, if any
}

// trkAnswer is what the recording provider answers.
type trkAnswer struct {
	status int
	header map[string]string
	body   []byte
}

// trkProvider is a stand-in for the provider's API on loopback that keeps
// the exact bytes of every request and answers in.php and res.php as the
// test sets (by default `OK|71000000001` and CAPCHA_NOT_READY).
type trkProvider struct {
	*httptest.Server

	mu   sync.Mutex
	seen []trkSeen
	in   trkAnswer
	res  trkAnswer
}

func newTrkProvider(t *testing.T) *trkProvider {
	p := &trkProvider{
		in:  trkAnswer{status: http.StatusOK, body: []byte("OK|71000000001")},
		res: trkAnswer{status: http.StatusOK, body: []byte("CAPCHA_NOT_READY")},
	}
	p.Server = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.Close)
	return p
}

func (p *trkProvider) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s := trkSeen{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: body}
	s.Form, s.File = trkParse(r, body)
	p.mu.Lock()
	p.seen = append(p.seen, s)
	a := p.in
	if strings.HasSuffix(r.URL.Path, "res.php") {
		a = p.res
	}
	p.mu.Unlock()
	for k, v := range a.header {
		w.Header().Set(k, v)
	}
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// trkParse reads the parameters of a request the way a PHP provider does.
func trkParse(r *http.Request, body []byte) (url.Values, []byte) {
	shadow := r.Clone(context.Background())
	shadow.Body = io.NopCloser(bytes.NewReader(body))
	shadow.Form, shadow.PostForm, shadow.MultipartForm = nil, nil, nil
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct != "multipart/form-data" {
		_ = shadow.ParseForm()
		return shadow.Form, nil
	}
	if err := shadow.ParseMultipartForm(32 << 20); err != nil {
		return nil, nil
	}
	defer shadow.MultipartForm.RemoveAll()
	var file []byte
	if fhs := shadow.MultipartForm.File["file"]; len(fhs) > 0 {
		if f, err := fhs[0].Open(); err == nil {
			file, _ = io.ReadAll(f)
			f.Close()
		}
	}
	return shadow.Form, file
}

// answer sets what in.php (path "in.php") or res.php answers from now on.
func (p *trkProvider) answer(path string, a trkAnswer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if path == "res.php" {
		p.res = a
	} else {
		p.in = a
	}
}

// requests returns what the provider received on paths ending in suffix.
func (p *trkProvider) requests(suffix string) []trkSeen {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []trkSeen
	for _, s := range p.seen {
		if strings.HasSuffix(s.Path, suffix) {
			out = append(out, s)
		}
	}
	return out
}

// holdResPHP makes the provider's res.php requests wait while hold says
// so: each held request sends on entered (buffered n) and then waits until
// gate is closed.
func (p *trkProvider) holdResPHP(n int, hold func() bool) (entered, gate chan struct{}) {
	entered, gate = make(chan struct{}, n), make(chan struct{})
	orig := p.Server.Config.Handler
	p.Server.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "res.php") && hold() {
			entered <- struct{}{}
			<-gate
		}
		orig.ServeHTTP(w, r)
	})
	return entered, gate
}

// reset forgets the requests received so far.
func (p *trkProvider) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen = nil
}

// trkSite is a site with the pingback route /cb in front of app and,
// for everything else, pingback_track (for 2captcha, with trackLines) in
// front of a reverse_proxy to upstream, the provider's API.
func trkSite(trackLines, upstream string, app *testkit.App) string {
	return fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider 2captcha
			# These tests send pingbacks for ids no submission made.
			unknown_ids accept
		}
		reverse_proxy %s
	}
	handle {
		pingback_track {
			provider 2captcha
			%s
		}
		reverse_proxy %s
	}
}
`, testHTTPPort, app.HostPort(), trackLines, upstream)
}

// trkResponse is an answer as the app received it.
type trkResponse struct {
	status int
	header http.Header
	body   []byte
}

// trkDo sends a request to the test site as an app would and returns the
// answer's exact bytes (compressed ones stay compressed). header holds
// extra request headers as name, value pairs.
func trkDo(t *testing.T, method, target, contentType string, body io.Reader, header ...string) trkResponse {
	t.Helper()
	req, err := http.NewRequest(method, testBase+target, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading answer: %v", method, target, err)
	}
	return trkResponse{status: resp.StatusCode, header: resp.Header, body: b}
}

// trkSubmission is an in.php submission as an app sends it.
type trkSubmission struct {
	name        string
	method      string // GET or POST
	target      string // path and query
	contentType string
	body        []byte
	file        []byte // the multipart file part's content, if any
}

// trkImage is a binary "image": every byte value, plus CR LF and dashes that
// could confuse a careless multipart rewrite.
func trkImage(n int) []byte {
	img := []byte("\x89PNG\r\n\x1a\n--\r\n\r\n--")
	for i := 0; len(img) < n; i++ {
		img = append(img, byte(i))
	}
	return img[:n]
}

// trkSubmissions returns one submission per encoding (GET: userrecaptcha,
// urlencoded: hcaptcha, multipart: an image, method post), with the extra
// fields (name, value pairs) appended (a pingback, say).
func trkSubmissions(t *testing.T, extra ...string) []trkSubmission {
	t.Helper()
	get := url.Values{}
	form := url.Values{}
	for _, v := range []url.Values{get, form} {
		v.Set("key", trkKey)
	}
	get.Set("method", "userrecaptcha")
	get.Set("googlekey", "6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-")
	get.Set("pageurl", "https://example.com/login?next=/a&b=c")
	get.Set("json", "1")
	form.Set("method", "hcaptcha")
	form.Set("sitekey", "10000000-ffff-ffff-ffff-000000000001")
	form.Set("pageurl", "https://example.com/")
	fields := []string{"key", trkKey, "method", "post", "json", "0", "textinstructions", "type the letters\r\n--and--"}
	for i := 0; i+1 < len(extra); i += 2 {
		get.Add(extra[i], extra[i+1])
		form.Add(extra[i], extra[i+1])
		fields = append(fields, extra[i], extra[i+1])
	}
	img := trkImage(3000)
	ct, mp := testkit.Multipart(t, img, fields...)
	return []trkSubmission{
		{name: "GET query", method: http.MethodGet, target: "/in.php?" + get.Encode()},
		{name: "urlencoded POST", method: http.MethodPost, target: "/in.php", contentType: "application/x-www-form-urlencoded", body: []byte(form.Encode())},
		{name: "multipart POST with image", method: http.MethodPost, target: "/in.php", contentType: ct, body: mp, file: img},
	}
}

// send sends the submission to the test site.
func (s trkSubmission) send(t *testing.T) trkResponse {
	t.Helper()
	var body io.Reader
	if s.body != nil {
		body = bytes.NewReader(s.body)
	}
	return trkDo(t, s.method, s.target, s.contentType, body)
}

// methodField is the submission's in.php method.
func (s trkSubmission) methodField() string {
	switch {
	case s.file != nil:
		return "post"
	case s.method == http.MethodGet:
		return "userrecaptcha"
	}
	return "hcaptcha"
}

// trkAssertRequest checks that the provider received the submission's
// query, content type and body byte for byte.
func trkAssertRequest(t *testing.T, s trkSubmission, got trkSeen) {
	t.Helper()
	u, _ := url.Parse(s.target)
	if got.Method != s.method || got.Path != u.Path || got.RawQuery != u.RawQuery {
		t.Errorf("provider got %s %s?%s, want %s %s", got.Method, got.Path, got.RawQuery, s.method, s.target)
	}
	if ct := got.Header.Get("Content-Type"); ct != s.contentType {
		t.Errorf("provider got Content-Type %q, want %q", ct, s.contentType)
	}
	if !bytes.Equal(got.Body, s.body) {
		t.Errorf("provider got a body of %d bytes that differs from the app's %d bytes:\n got %q\nwant %q",
			len(got.Body), len(s.body), trkClip(got.Body), trkClip(s.body))
	}
}

func trkClip(b []byte) []byte {
	if len(b) > 300 {
		return b[:300]
	}
	return b
}

// trkAssertAnswer checks that the app received the provider's answer
// unchanged.
func trkAssertAnswer(t *testing.T, want trkAnswer, got trkResponse) {
	t.Helper()
	if got.status != want.status || !bytes.Equal(got.body, want.body) {
		t.Errorf("app got %d %q, want the provider's %d %q", got.status, got.body, want.status, want.body)
	}
	for k, v := range want.header {
		if got.header.Get(k) != v {
			t.Errorf("app got header %s: %q, want the provider's %q", k, got.header.Get(k), v)
		}
	}
}

// trkTask reads a task from the running config's store.
func trkTask(t *testing.T, id string) (*store.Task, error) {
	t.Helper()
	st := runningApp(t).store(time.Second)
	if st == nil {
		t.Fatal("store not open")
	}
	return st.GetTask(context.Background(), store.Key{Provider: "2captcha", ID: id})
}

// trkAssertPending checks a tracked task: pending, with the given fields, a
// submission time within [before, after] and its first poll due trkAfter
// past submission.
func trkAssertPending(t *testing.T, id, method, pingback string, before, after time.Time) {
	t.Helper()
	task, err := trkTask(t, id)
	if err != nil {
		t.Fatalf("task %s not tracked: %v", id, err)
	}
	if task.Provider != "2captcha" || task.ID != id || task.Method != method || task.PingbackURL != pingback || task.State != store.TaskPending {
		t.Errorf("task = {provider %q, id %q, method %q, pingback %q, state %q}, want {2captcha, %q, %q, %q, pending}",
			task.Provider, task.ID, task.Method, task.PingbackURL, task.State, id, method, pingback)
	}
	if task.SubmittedAt.Before(before) || task.SubmittedAt.After(after) {
		t.Errorf("submitted_at %s, want between %s and %s", task.SubmittedAt, before, after)
	}
	if want := task.SubmittedAt.Add(trkAfter); !task.NextPollAt.Equal(want) {
		t.Errorf("next_poll_at %s, want submitted_at + %s = %s", task.NextPollAt, trkAfter, want)
	}
}

// trkAssertNoTask checks that no task is tracked under id.
func trkAssertNoTask(t *testing.T, id string) {
	t.Helper()
	if task, err := trkTask(t, id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("task %s: want none tracked, got %+v, error %v", id, task, err)
	}
}

// trkAssertNotStored checks that no result is stored under id.
func trkAssertNotStored(t *testing.T, id string) {
	t.Helper()
	st := runningApp(t).store(time.Second)
	if rec, err := st.Get(context.Background(), store.Key{Provider: "2captcha", ID: id}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("result %s: want none stored, got %+v, error %v", id, rec, err)
	}
}

// trkPending returns every pending task of the running store.
func trkPending(t *testing.T) []*store.Task {
	t.Helper()
	st := runningApp(t).store(time.Second)
	tasks, err := st.DueTasks(context.Background(), store.DueQuery{Now: time.Now().Add(24 * time.Hour), Limit: 1000, Accounts: trkAccounts})
	if err != nil {
		t.Fatal(err)
	}
	return tasks
}

// trkPingback delivers a 2captcha-style pingback (POST form id, code) to
// the test site's /cb route (with the task's token, as the provider
// would, for a tracked task) and checks that it was acknowledged.
func trkPingback(t *testing.T, id, code string) {
	t.Helper()
	target := "/cb"
	if task, err := trkTask(t, id); err == nil && task.Token != "" {
		target += "?" + protocol.TokenParam + "=" + task.Token
	}
	resp := trkDo(t, http.MethodPost, target, "application/x-www-form-urlencoded",
		strings.NewReader(url.Values{"id": {id}, "code": {code}}.Encode()))
	if resp.status != http.StatusOK || string(resp.body) != "OK" {
		t.Fatalf("pingback %s: got %d %q, want 200 OK", id, resp.status, resp.body)
	}
}

// TestTrackForwardsSubmissionsUnchanged checks that a submission that
// already carries a pingback reaches the provider byte for byte in each
// encoding (the image upload included), that the app gets the provider's
// answer unchanged, and that the task is tracked with the submission's own
// pingback URL (not the configured one).
func TestTrackForwardsSubmissionsUnchanged(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startCaddy(t, trkGlobal, trkSite("pingback_url "+trkCallbackURL, prov.URL, app))

	own := trkCallbackURL + "?app=1"
	answers := []trkAnswer{
		{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json", "X-Provider-Trace": "a1"}, body: []byte(`{"status":1,"request":"71000000011"}`)},
		{status: http.StatusOK, header: map[string]string{"Content-Type": "text/plain", "X-Provider-Trace": "a2"}, body: []byte("OK|71000000012")},
		{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json", "X-Provider-Trace": "a3"}, body: []byte(`{"status":1,"request":71000000013}`)},
	}
	ids := []string{"71000000011", "71000000012", "71000000013"}
	for i, sub := range trkSubmissions(t, "pingback", own) {
		t.Run(sub.name, func(t *testing.T) {
			prov.reset()
			prov.answer("in.php", answers[i])
			before := time.Now()
			resp := sub.send(t)
			after := time.Now()

			trkAssertAnswer(t, answers[i], resp)
			seen := prov.requests("in.php")
			if len(seen) != 1 {
				t.Fatalf("provider got %d submissions, want 1", len(seen))
			}
			// The app's own pingback URL carries a token now, except
			// in a GET submission (its URL has a query).
			got, tok := trkUntoken(t, seen[0])
			if (tok == "") != (sub.method == http.MethodGet) {
				t.Errorf("token %q in a %s submission", tok, sub.method)
			}
			trkAssertRequest(t, sub, got)
			if got := got.Form["pingback"]; len(got) != 1 || got[0] != own {
				t.Errorf("provider parsed pingback %q, want only the app's %q", got, own)
			}
			if task, err := trkTask(t, ids[i]); err != nil || task.Token != tok {
				t.Errorf("task's token %+v, %v; want %q", task, err, tok)
			}
			if sub.file != nil && !bytes.Equal(seen[0].File, sub.file) {
				t.Errorf("provider got an image of %d bytes that differs from the app's %d bytes", len(seen[0].File), len(sub.file))
			}
			trkAssertPending(t, ids[i], sub.methodField(), own, before, after)
		})
	}
}

// TestTrackAnswerFormats checks that the task id is read from each in.php
// answer form (plain, JSON with a string or a numeric id, gzip-compressed)
// and the task recorded as pending, while the app gets the answer as sent.
func TestTrackAnswerFormats(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startCaddy(t, trkGlobal, trkSite("", prov.URL, app))

	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("OK|71000000024"))
	_ = zw.Close()

	tests := []struct {
		name string
		ans  trkAnswer
		id   string
	}{
		{"plain", trkAnswer{status: http.StatusOK, body: []byte("OK|71000000021")}, "71000000021"},
		{"plain with newline", trkAnswer{status: http.StatusOK, body: []byte("OK|71000000025\n")}, "71000000025"},
		{"JSON string id", trkAnswer{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json"}, body: []byte(`{"status":1,"request":"71000000022"}`)}, "71000000022"},
		{"JSON numeric id", trkAnswer{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json"}, body: []byte(`{"status": 1, "request": 71000000023}`)}, "71000000023"},
		{"gzip", trkAnswer{status: http.StatusOK, header: map[string]string{"Content-Encoding": "gzip"}, body: gz.Bytes()}, "71000000024"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prov.answer("in.php", tc.ans)
			q := url.Values{"key": {trkKey}, "method": {"turnstile"}, "sitekey": {"0x4AAA"}, "pageurl": {"https://example.com"}, "pingback": {trkCallbackURL}}
			before := time.Now()
			resp := trkDo(t, http.MethodGet, "/in.php?"+q.Encode(), "", nil, "Accept-Encoding", "gzip")
			after := time.Now()
			trkAssertAnswer(t, tc.ans, resp)
			trkAssertPending(t, tc.id, "turnstile", trkCallbackURL, before, after)
		})
	}
}

// TestTrackInjectsPingback checks that a submission without a pingback
// gets the configured pingback_url added, in each encoding, with every
// other byte unchanged, and that the task is tracked with it.
func TestTrackInjectsPingback(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startCaddy(t, trkGlobal, trkSite("pingback_url "+trkCallbackURL, prov.URL, app))

	escaped := url.QueryEscape(trkCallbackURL)
	for i, sub := range trkSubmissions(t) {
		t.Run(sub.name, func(t *testing.T) {
			prov.reset()
			id := fmt.Sprintf("7100000003%d", i)
			ans := trkAnswer{status: http.StatusOK, body: []byte("OK|" + id)}
			prov.answer("in.php", ans)
			before := time.Now()
			resp := sub.send(t)
			after := time.Now()
			trkAssertAnswer(t, ans, resp)

			seen := prov.requests("in.php")
			if len(seen) != 1 {
				t.Fatalf("provider got %d submissions, want 1", len(seen))
			}
			got, tok := trkUntoken(t, seen[0])
			if tok == "" {
				t.Errorf("the added pingback URL carries no token")
			}
			if pb := got.Form["pingback"]; len(pb) != 1 || pb[0] != trkCallbackURL {
				t.Errorf("provider parsed pingback %q, want [%q]", pb, trkCallbackURL)
			}
			if ct := got.Header.Get("Content-Type"); ct != sub.contentType {
				t.Errorf("provider got Content-Type %q, want %q", ct, sub.contentType)
			}
			u, _ := url.Parse(sub.target)
			switch {
			case sub.method == http.MethodGet:
				if want := u.RawQuery + "&pingback=" + escaped; got.RawQuery != want || len(got.Body) != 0 {
					t.Errorf("provider got query %q and a %d-byte body, want query %q and no body", got.RawQuery, len(got.Body), want)
				}
			case sub.file == nil:
				if want := string(sub.body) + "&pingback=" + escaped; string(got.Body) != want || got.RawQuery != u.RawQuery {
					t.Errorf("provider got body %q, want %q", got.Body, want)
				}
			default:
				_, params, _ := mime.ParseMediaType(sub.contentType)
				part := "--" + params["boundary"] + "\r\nContent-Disposition: form-data; name=\"pingback\"\r\n\r\n" + trkCallbackURL + "\r\n"
				before, after, found := bytes.Cut(got.Body, []byte(part))
				if !found {
					t.Fatalf("provider's body has no pingback part %q:\n%q", part, got.Body)
				}
				if rest := append(bytes.Clone(before), after...); !bytes.Equal(rest, sub.body) {
					t.Errorf("without the pingback part, the provider's body differs from the app's:\n got %q\nwant %q", trkClip(rest), trkClip(sub.body))
				}
				if !bytes.Equal(got.File, sub.file) {
					t.Errorf("provider got an image of %d bytes that differs from the app's %d bytes", len(got.File), len(sub.file))
				}
				if got.Form.Get("textinstructions") != "type the letters\r\n--and--" || got.Form.Get("key") != trkKey {
					t.Errorf("provider parsed the other fields as %v", got.Form)
				}
			}
			trkAssertPending(t, id, sub.methodField(), trkCallbackURL, before, after)
		})
	}
}

// TestTrackWithoutPingbackURL checks that without pingback_url, a
// submission without a pingback is forwarded untouched and not tracked
// (the plugin would have nowhere to deliver a polled result), while one
// with a pingback is still tracked.
func TestTrackWithoutPingbackURL(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startCaddy(t, trkGlobal, trkSite("", prov.URL, app))

	for i, sub := range trkSubmissions(t) {
		t.Run(sub.name, func(t *testing.T) {
			prov.reset()
			id := fmt.Sprintf("7100000004%d", i)
			ans := trkAnswer{status: http.StatusOK, body: []byte("OK|" + id)}
			prov.answer("in.php", ans)
			resp := sub.send(t)
			trkAssertAnswer(t, ans, resp)
			seen := prov.requests("in.php")
			if len(seen) != 1 {
				t.Fatalf("provider got %d submissions, want 1", len(seen))
			}
			trkAssertRequest(t, sub, seen[0])
			trkAssertNoTask(t, id)
		})
	}
	t.Run("with its own pingback", func(t *testing.T) {
		sub := trkSubmissions(t, "pingback", trkCallbackURL)[1]
		prov.answer("in.php", trkAnswer{status: http.StatusOK, body: []byte("OK|71000000049")})
		before := time.Now()
		sub.send(t)
		trkAssertPending(t, "71000000049", "hcaptcha", trkCallbackURL, before, time.Now())
	})
}

// TestTrackProviderErrors checks that in.php errors and server failures
// reach the app unchanged and track nothing, even a 5xx whose body looks
// like a task id.
func TestTrackProviderErrors(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startCaddy(t, trkGlobal, trkSite("pingback_url "+trkCallbackURL, prov.URL, app))

	tests := []struct {
		name string
		ans  trkAnswer
	}{
		{"plain error", trkAnswer{status: http.StatusOK, body: []byte("ERROR_ZERO_BALANCE")}},
		{"JSON error", trkAnswer{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json"}, body: []byte(`{"status":0,"request":"ERROR_ZERO_BALANCE","error_text":"no money"}`)}},
		{"HTML 503", trkAnswer{status: http.StatusServiceUnavailable, header: map[string]string{"Content-Type": "text/html", "Retry-After": "5"}, body: []byte("<html><body><h1>503 Service Unavailable</h1></body></html>")}},
		{"500 with an id-like body", trkAnswer{status: http.StatusInternalServerError, body: []byte("OK|71000000059")}},
		{"JSON status 0 with a numeric request", trkAnswer{status: http.StatusOK, body: []byte(`{"status":0,"request":71000000058}`)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prov.answer("in.php", tc.ans)
			for _, sub := range trkSubmissions(t) {
				trkAssertAnswer(t, tc.ans, sub.send(t))
			}
		})
	}
	if tasks := trkPending(t); len(tasks) != 0 {
		t.Errorf("tracked %d tasks from error answers, want none; first: %+v", len(tasks), tasks[0])
	}
	trkAssertNoTask(t, "71000000059")
	trkAssertNoTask(t, "71000000058")
}

// TestTrackAnswersResultLocally checks that res.php?action=get for a
// result the plugin holds (here by pingback) is answered in the format the
// app asked for without calling the provider, task errors included.
func TestTrackAnswersResultLocally(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startCaddy(t, trkGlobal, trkSite("pingback_url "+trkCallbackURL, prov.URL, app))

	// A tracked task solved by pingback, an untracked one with an answer
	// containing "|", and an unsolvable one.
	prov.answer("in.php", trkAnswer{status: http.StatusOK, body: []byte("OK|71000000061")})
	trkSubmissions(t)[0].send(t)
	trkPingback(t, "71000000061", "03AGdBq25-TOKEN")
	trkPingback(t, "71000000062", "x=12,y=34|x=56,y=78")
	trkPingback(t, "71000000063", "ERROR_CAPTCHA_UNSOLVABLE")
	for _, id := range []string{"71000000061", "71000000062", "71000000063"} {
		if n := app.Count("2captcha:" + id); n != 1 {
			t.Fatalf("app got the pingback of %s %d times, want 1", id, n)
		}
	}
	if task, err := trkTask(t, "71000000061"); err != nil || task.State != store.TaskDone {
		t.Errorf("task after its pingback: %+v, %v; want state done", task, err)
	}

	tests := []struct {
		name, method, query, wantType, want string
	}{
		{"json=0", http.MethodGet, "action=get&id=71000000061", "text/plain", "OK|03AGdBq25-TOKEN"},
		{"json=1", http.MethodGet, "action=get&id=71000000061&json=1", "application/json", `{"status":1,"request":"03AGdBq25-TOKEN"}`},
		{"json=0 answer with |", http.MethodGet, "action=get&id=71000000062&json=0", "text/plain", "OK|x=12,y=34|x=56,y=78"},
		{"json=1 answer with |", http.MethodGet, "json=1&action=get&id=71000000062", "application/json", `{"status":1,"request":"x=12,y=34|x=56,y=78"}`},
		{"json=0 unsolvable", http.MethodGet, "action=get&id=71000000063", "text/plain", "ERROR_CAPTCHA_UNSOLVABLE"},
		{"json=1 unsolvable", http.MethodGet, "action=get&id=71000000063&json=1", "application/json", `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`},
		{"POST form json=1", http.MethodPost, "action=get&id=71000000061&json=1", "application/json", `{"status":1,"request":"03AGdBq25-TOKEN"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := "key=" + trkKey + "&" + tc.query
			var resp trkResponse
			if tc.method == http.MethodGet {
				resp = trkDo(t, http.MethodGet, "/res.php?"+q, "", nil)
			} else {
				resp = trkDo(t, http.MethodPost, "/res.php", "application/x-www-form-urlencoded", strings.NewReader(q))
			}
			if resp.status != http.StatusOK || string(resp.body) != tc.want {
				t.Errorf("got %d %q, want 200 %q", resp.status, resp.body, tc.want)
			}
			if ct := resp.header.Get("Content-Type"); !strings.HasPrefix(ct, tc.wantType) {
				t.Errorf("Content-Type %q, want %s", ct, tc.wantType)
			}
		})
	}
	if seen := prov.requests("res.php"); len(seen) != 0 {
		t.Errorf("provider got %d res.php requests for results the plugin holds, want 0; first: %+v", len(seen), seen[0])
	}

	// Only the account's own key is answered locally: a wrong or missing
	// key goes to the provider, which judges it.
	prov.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte("ERROR_WRONG_USER_KEY")})
	for _, q := range []string{"key=WRONG&action=get&id=71000000061", "action=get&id=71000000061&json=1"} {
		resp := trkDo(t, http.MethodGet, "/res.php?"+q, "", nil)
		if string(resp.body) != "ERROR_WRONG_USER_KEY" {
			t.Errorf("res.php?%s: got %q, want the provider's ERROR_WRONG_USER_KEY", q, resp.body)
		}
	}
	if seen := prov.requests("res.php"); len(seen) != 2 {
		t.Errorf("provider got %d res.php requests for wrong or missing keys, want 2", len(seen))
	}

	// Anything else on res.php is the provider's business.
	ans := trkAnswer{status: http.StatusOK, body: []byte("03AGdBq25-TOKEN|x=12,y=34|x=56,y=78")}
	prov.answer("res.php", ans)
	for _, q := range []string{
		"action=get&ids=71000000061,71000000062,71000000063",
		"action=get2&id=71000000061",
		"action=getbalance",
	} {
		trkAssertAnswer(t, ans, trkDo(t, http.MethodGet, "/res.php?key="+trkKey+"&"+q, "", nil))
	}
	if seen := prov.requests("res.php"); len(seen) != 5 {
		t.Errorf("provider got %d res.php requests, want the 2 above and the 3 the plugin cannot answer", len(seen))
	}
}

// TestTrackResultPassThrough checks that res.php for a result the plugin
// does not hold goes to the provider and back unchanged, and that a result
// the provider returns is stored: later res.php requests are answered
// locally and a later pingback for it is a duplicate the app never sees.
func TestTrackResultPassThrough(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startCaddy(t, trkGlobal, trkSite("pingback_url "+trkCallbackURL, prov.URL, app))
	st := runningApp(t).store(time.Second)

	t.Run("untracked task, plain", func(t *testing.T) {
		prov.reset()
		const id = "71000000071"
		notReady := trkAnswer{status: http.StatusOK, body: []byte("CAPCHA_NOT_READY")}
		prov.answer("res.php", notReady)
		target := "/res.php?key=" + trkKey + "&action=get&id=" + id
		trkAssertAnswer(t, notReady, trkDo(t, http.MethodGet, target, "", nil))
		trkAssertNotStored(t, id)

		solved := trkAnswer{status: http.StatusOK, header: map[string]string{"X-Provider-Trace": "r2"}, body: []byte("OK|TOKEN-071")}
		prov.answer("res.php", solved)
		trkAssertAnswer(t, solved, trkDo(t, http.MethodGet, target, "", nil))
		rec := getRecord(t, "2captcha", id)
		if rec.Code != "TOKEN-071" || rec.Source != "poll" || rec.State != store.StateDelivered {
			t.Errorf("stored {code %q, source %q, state %q}, want {TOKEN-071, poll, delivered}", rec.Code, rec.Source, rec.State)
		}

		// Asked again: answered locally.
		prov.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte("ERROR_WRONG_CAPTCHA_ID")})
		if resp := trkDo(t, http.MethodGet, target+"&json=1", "", nil); string(resp.body) != `{"status":1,"request":"TOKEN-071"}` {
			t.Errorf("second res.php: got %d %q, want the stored result", resp.status, resp.body)
		}
		if n := len(prov.requests("res.php")); n != 2 {
			t.Errorf("provider got %d res.php requests, want 2", n)
		}

		trkPingback(t, id, "TOKEN-071")
		if n := app.Count("2captcha:" + id); n != 0 {
			t.Errorf("app got the pingback of a result it already fetched %d times, want 0", n)
		}
		if rec := getRecord(t, "2captcha", id); rec.Source != "poll" || rec.Code != "TOKEN-071" {
			t.Errorf("record after the pingback: source %q code %q, want the stored one unchanged", rec.Source, rec.Code)
		}
	})

	t.Run("tracked task, JSON", func(t *testing.T) {
		prov.reset()
		const id = "71000000072"
		prov.answer("in.php", trkAnswer{status: http.StatusOK, body: []byte(`{"status":1,"request":71000000072}`)})
		trkSubmissions(t)[0].send(t)
		if _, err := trkTask(t, id); err != nil {
			t.Fatalf("task not tracked: %v", err)
		}
		solved := trkAnswer{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json"},
			body: []byte(`{"status":1,"request":"TOKEN-072","useragent":"Mozilla/5.0"}`)}
		prov.answer("res.php", solved)
		trkAssertAnswer(t, solved, trkDo(t, http.MethodGet, "/res.php?key="+trkKey+"&action=get&json=1&id="+id, "", nil))

		rec := getRecord(t, "2captcha", id)
		if rec.Code != "TOKEN-072" || rec.Source != "poll" || rec.State != store.StateDelivered || rec.Server == "" || rec.SubmittedAt.IsZero() {
			t.Errorf("stored {code %q, source %q, state %q, server %q, submitted %s}, want the result, poll, delivered, the /cb server and the submission time",
				rec.Code, rec.Source, rec.State, rec.Server, rec.SubmittedAt)
		}
		task, err := trkTask(t, id)
		if err != nil || task.State != store.TaskDone {
			t.Errorf("task: %+v, %v; want state done (never polled)", task, err)
		}
		if due, err := st.DueTasks(context.Background(), store.DueQuery{Now: time.Now().Add(time.Hour), Limit: 100, Accounts: trkAccounts}); err != nil || len(due) != 0 {
			t.Errorf("due tasks: %d, %v; want none", len(due), err)
		}

		trkPingback(t, id, "TOKEN-072")
		if n := app.Count("2captcha:" + id); n != 0 {
			t.Errorf("app got the pingback of a result it already fetched %d times, want 0", n)
		}
	})

	// A task-final error is the task's outcome, delivered like a result
	// (issue 3 item 6): once the app has fetched it, a pingback or a poll
	// of it must not reach the app a second time.
	t.Run("task error", func(t *testing.T) {
		for _, tc := range []struct {
			id  string
			ans trkAnswer
		}{
			{"71000000074", trkAnswer{status: http.StatusOK, body: []byte("ERROR_CAPTCHA_UNSOLVABLE")}},
			{"71000000075", trkAnswer{status: http.StatusOK, body: []byte(`{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`)}},
		} {
			prov.reset()
			prov.answer("in.php", trkAnswer{status: http.StatusOK, body: []byte("OK|" + tc.id)})
			trkSubmissions(t)[1].send(t)
			prov.answer("res.php", tc.ans)
			target := "/res.php?key=" + trkKey + "&action=get&id=" + tc.id
			trkAssertAnswer(t, tc.ans, trkDo(t, http.MethodGet, target, "", nil))

			rec := getRecord(t, "2captcha", tc.id)
			if rec.Code != "ERROR_CAPTCHA_UNSOLVABLE" || rec.State != store.StateDelivered {
				t.Errorf("%s: stored {code %q, state %q}, want {ERROR_CAPTCHA_UNSOLVABLE, delivered}", tc.id, rec.Code, rec.State)
			}
			if task, err := trkTask(t, tc.id); err != nil || task.State != store.TaskDone {
				t.Errorf("%s: task %+v, %v; want state done (never polled)", tc.id, task, err)
			}
			if resp := trkDo(t, http.MethodGet, target+"&json=1", "", nil); string(resp.body) != `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}` {
				t.Errorf("%s: second res.php got %q, want the stored error", tc.id, resp.body)
			}
			if n := len(prov.requests("res.php")); n != 1 {
				t.Errorf("%s: provider got %d res.php requests, want 1", tc.id, n)
			}
			trkPingback(t, tc.id, "ERROR_CAPTCHA_UNSOLVABLE")
			if n := app.Count("2captcha:" + tc.id); n != 0 {
				t.Errorf("%s: app got the pingback of an error it already fetched %d times, want 0", tc.id, n)
			}
		}
	})

	t.Run("provider failure stores nothing", func(t *testing.T) {
		const id = "71000000073"
		for _, ans := range []trkAnswer{
			{status: http.StatusOK, body: []byte(`{"status":0,"request":"CAPCHA_NOT_READY"}`)},
			{status: http.StatusOK, body: []byte("ERROR_NO_SLOT_AVAILABLE")},
			{status: http.StatusBadGateway, body: []byte("OK|TOKEN-FROM-A-PROXY-PAGE")},
			{status: http.StatusOK, body: []byte("<html>OK</html>")},
		} {
			prov.answer("res.php", ans)
			trkAssertAnswer(t, ans, trkDo(t, http.MethodGet, "/res.php?key="+trkKey+"&action=get&json=1&id="+id, "", nil))
		}
		trkAssertNotStored(t, id)
	})
}

// TestTrackMaxBody checks that a submission over max_body is forwarded
// byte for byte (no pingback added) and the answer returned, untracked,
// whether its length is announced or not, while small ones are tracked.
func TestTrackMaxBody(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startCaddy(t, trkGlobal, trkSite("pingback_url "+trkCallbackURL+"\n\t\t\tmax_body 1KiB", prov.URL, app))

	big := url.Values{"key": {trkKey}, "method": {"base64"}, "body": {strings.Repeat("iVBORw0KGgo", 200)}}.Encode()
	ct, mp := testkit.Multipart(t, trkImage(2048), "key", trkKey, "method", "post")
	tests := []struct {
		name        string
		contentType string
		body        []byte
		chunked     bool
	}{
		{"urlencoded", "application/x-www-form-urlencoded", []byte(big), false},
		{"multipart", ct, mp, false},
		{"urlencoded chunked", "application/x-www-form-urlencoded", []byte(big), true},
		{"multipart chunked", ct, mp, true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			prov.reset()
			id := fmt.Sprintf("7100000008%d", i)
			ans := trkAnswer{status: http.StatusOK, body: []byte("OK|" + id)}
			prov.answer("in.php", ans)
			var body io.Reader = bytes.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body) // hides the length: sent chunked
			}
			trkAssertAnswer(t, ans, trkDo(t, http.MethodPost, "/in.php", tc.contentType, body))
			seen := prov.requests("in.php")
			if len(seen) != 1 {
				t.Fatalf("provider got %d submissions, want 1", len(seen))
			}
			trkAssertRequest(t, trkSubmission{method: http.MethodPost, target: "/in.php", contentType: tc.contentType, body: tc.body}, seen[0])
			trkAssertNoTask(t, id)
		})
	}
	t.Run("small submission still tracked", func(t *testing.T) {
		prov.answer("in.php", trkAnswer{status: http.StatusOK, body: []byte("OK|71000000089")})
		before := time.Now()
		trkDo(t, http.MethodPost, "/in.php", "application/x-www-form-urlencoded", strings.NewReader("key="+trkKey+"&method=turnstile&sitekey=0x4&pageurl=https%3A%2F%2Fexample.com"))
		trkAssertPending(t, "71000000089", "turnstile", trkCallbackURL, before, time.Now())
	})
}

// TestTrackWithSimulator runs the whole flow against the provider
// simulator: a multipart image upload without pingback gets the plugin's
// pingback URL, the simulator's pingback reaches the app through /cb, and
// the app's res.php requests are then answered without the provider.
func TestTrackWithSimulator(t *testing.T) {
	sim, err := captchasim.New(captchasim.Config{Seed: 7, SolveMin: time.Hour, SolveMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(func() { srv.Close(); sim.Close() })
	app := newAppStub(t)
	startCaddy(t, trkGlobal, trkSite("pingback_url "+trkCallbackURL, srv.URL, app))

	img := trkImage(5000)
	ct, mp := testkit.Multipart(t, img, "key", captchasim.DefaultKey, "method", "post", "json", "1")
	before := time.Now()
	resp := trkDo(t, http.MethodPost, "/in.php", ct, bytes.NewReader(mp))
	after := time.Now()
	var ans struct {
		Status  int    `json:"status"`
		Request string `json:"request"`
	}
	if err := json.Unmarshal(resp.body, &ans); err != nil || resp.status != http.StatusOK || ans.Status != 1 {
		t.Fatalf("submission: got %d %q, want a JSON task id", resp.status, resp.body)
	}
	id := ans.Request
	info, ok := sim.Task(id)
	if pb, tok, _ := untokened(info.Pingback); !ok || pb != trkCallbackURL || tok == "" {
		t.Fatalf("simulator's task %s: %+v, want pingback %q", id, info, trkCallbackURL)
	}
	trkAssertPending(t, id, "post", trkCallbackURL, before, after)

	if !sim.Solve(id) {
		t.Fatalf("simulator could not solve %s", id)
	}
	testkit.WaitFor(t, 5*time.Second, "the simulator's pingback", func() bool { return sim.Stats().PingbacksSent == 1 })
	if st := sim.Stats(); st.PingbacksFailed != 0 {
		t.Fatalf("pingback failed: %+v", st)
	}
	reqs := app.Requests()
	if len(reqs) != 1 || reqs[0].Header.Get(HeaderIdempotencyKey) != "2captcha:"+id {
		t.Fatalf("app got %+v, want the pingback of %s once", reqs, id)
	}
	code := getRecord(t, "2captcha", id).Code
	form, _ := url.ParseQuery(reqs[0].Body)
	if code == "" || form.Get("code") != code {
		t.Fatalf("app got code %q, stored %q", form.Get("code"), code)
	}

	for _, tc := range []struct{ json, want string }{
		{"0", "OK|" + code},
		{"1", `{"status":1,"request":"` + code + `"}`},
	} {
		resp := trkDo(t, http.MethodGet, "/res.php?key="+captchasim.DefaultKey+"&action=get&json="+tc.json+"&id="+id, "", nil)
		if resp.status != http.StatusOK || string(resp.body) != tc.want {
			t.Errorf("res.php json=%s: got %d %q, want %q", tc.json, resp.status, resp.body, tc.want)
		}
	}
	if n := sim.Stats().ResCalls; n != 0 {
		t.Errorf("simulator served %d res.php calls, want 0", n)
	}
}

func TestAddPingback(t *testing.T) {
	const pb = "https://example.com/cb?a=1&b=2"
	esc := url.QueryEscape(pb)
	const boundary = "XyZ"
	mp := func(parts ...string) string {
		var b strings.Builder
		for i := 0; i+1 < len(parts); i += 2 {
			b.WriteString("--" + boundary + "\r\nContent-Disposition: form-data; name=\"" + parts[i] + "\"\r\n\r\n" + parts[i+1] + "\r\n")
		}
		return b.String()
	}
	file := "--" + boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c.png\"\r\nContent-Type: application/octet-stream\r\n\r\n\x89PNG\r\n--XyZ-\x00\xff\r\n"
	closing := "--" + boundary + "--\r\n"
	mpType := "multipart/form-data; boundary=" + boundary

	tests := []struct {
		name        string
		method      string
		target      string
		contentType string
		body        string
		wantOK      bool
		wantQuery   string // the request's query afterwards
		wantBody    string
	}{
		{
			name: "GET with a query", method: http.MethodGet, target: "/in.php?key=k&method=userrecaptcha",
			wantOK: true, wantQuery: "key=k&method=userrecaptcha&pingback=" + esc,
		},
		{
			name: "GET without a query", method: http.MethodGet, target: "/in.php",
			wantOK: true, wantQuery: "pingback=" + esc,
		},
		{
			name: "urlencoded", method: http.MethodPost, target: "/in.php?json=1", contentType: "application/x-www-form-urlencoded",
			body: "key=k&method=hcaptcha", wantOK: true, wantQuery: "json=1", wantBody: "key=k&method=hcaptcha&pingback=" + esc,
		},
		{
			name: "urlencoded with a trailing &", method: http.MethodPost, target: "/in.php", contentType: "application/x-www-form-urlencoded; charset=utf-8",
			body: "key=k&method=hcaptcha&", wantOK: true, wantBody: "key=k&method=hcaptcha&pingback=" + esc,
		},
		{
			name: "multipart", method: http.MethodPost, target: "/in.php", contentType: mpType,
			body:   mp("key", "k", "method", "post") + file + closing,
			wantOK: true, wantBody: mp("key", "k", "method", "post") + file + mp("pingback", pb) + closing,
		},
		{
			name: "multipart with a quoted boundary", method: http.MethodPost, target: "/in.php", contentType: `multipart/form-data; boundary="XyZ"`,
			body:   mp("key", "k") + closing,
			wantOK: true, wantBody: mp("key", "k") + mp("pingback", pb) + closing,
		},
		{
			name: "multipart without closing boundary", method: http.MethodPost, target: "/in.php", contentType: mpType,
			body: mp("key", "k", "method", "post") + file,
		},
		{
			name: "multipart without boundary", method: http.MethodPost, target: "/in.php", contentType: "multipart/form-data",
			body: mp("key", "k") + closing,
		},
		{
			name: "JSON body", method: http.MethodPost, target: "/in.php", contentType: "application/json",
			body: `{"key":"k"}`,
		},
		{
			name: "no content type", method: http.MethodPost, target: "/in.php",
			body: "key=k",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			query := r.URL.RawQuery
			nb, ok := addPingback(r, []byte(tc.body), pb)
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if !ok {
				if r.URL.RawQuery != query {
					t.Errorf("query changed to %q on failure", r.URL.RawQuery)
				}
				return
			}
			if string(nb) != tc.wantBody {
				t.Errorf("body:\n got %q\nwant %q", nb, tc.wantBody)
			}
			if want := tc.wantQuery; r.URL.RawQuery != want {
				t.Errorf("query %q, want %q", r.URL.RawQuery, want)
			}
			if want := r.URL.Path + "?" + r.URL.RawQuery; tc.body == "" && r.RequestURI != want {
				t.Errorf("RequestURI %q, want %q", r.RequestURI, want)
			}
			// The result is a well-formed submission that carries the
			// pingback exactly once.
			setBody(r, nb)
			if got := submitParams(r, nb, 1<<20)["pingback"]; len(got) != 1 || got[0] != pb {
				t.Errorf("parsed pingback %q, want [%q]", got, pb)
			}
		})
	}

	t.Run("does not modify the input body", func(t *testing.T) {
		body := []byte("key=k&&&")
		r := httptest.NewRequest(http.MethodPost, "/in.php", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if _, ok := addPingback(r, body, pb); !ok || string(body) != "key=k&&&" {
			t.Errorf("input body now %q (ok %v), want it unchanged", body, ok)
		}
	})
}

func TestReadUpTo(t *testing.T) {
	const limit = 16
	tests := []struct {
		name    string
		body    string
		hideLen bool // unknown length, as a chunked request
	}{
		{"empty", "", false},
		{"short", "key=k", false},
		{"short, unknown length", "key=k", true},
		{"at the limit", strings.Repeat("a", limit), false},
		{"at the limit, unknown length", strings.Repeat("a", limit), true},
		{"one over", strings.Repeat("b", limit+1), false},
		{"one over, unknown length", strings.Repeat("b", limit+1), true},
		{"far over", strings.Repeat("c", 10*limit), false},
		{"far over, unknown length", strings.Repeat("c", 10*limit), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantWhole := len(tc.body) <= limit
			var rd io.Reader = strings.NewReader(tc.body)
			if tc.hideLen {
				rd = io.MultiReader(rd)
			}
			r := httptest.NewRequest(http.MethodPost, "/in.php", rd)
			if tc.hideLen {
				r.ContentLength = -1
			}
			body, whole, err := readUpTo(r, limit)
			if err != nil {
				t.Fatal(err)
			}
			if whole != wantWhole {
				t.Fatalf("whole = %v, want %v", whole, wantWhole)
			}
			if whole {
				if string(body) != tc.body {
					t.Errorf("body %q, want %q", body, tc.body)
				}
				return
			}
			// Passed through: the request's body still reads whole.
			rest, err := io.ReadAll(r.Body)
			if err != nil || string(rest) != tc.body {
				t.Errorf("request body now reads %q (%v), want all of %q", rest, err, tc.body)
			}
		})
	}

	t.Run("no body", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodGet, "/in.php?key=k", nil)
		if body, whole, err := readUpTo(r, limit); body != nil || !whole || err != nil {
			t.Errorf("got %q, %v, %v; want nil, true, nil", body, whole, err)
		}
	})
	t.Run("read error", func(t *testing.T) {
		r := httptest.NewRequest(http.MethodPost, "/in.php", iotest.ErrReader(io.ErrUnexpectedEOF))
		r.ContentLength = -1
		if _, _, err := readUpTo(r, limit); err == nil {
			t.Error("want an error")
		}
	})
}

// TestLocalResAnswersAreExact: a structured result (an object request)
// and a result with an extra field (Turnstile's useragent), seen in a
// passed-through res.php answer, are answered locally afterwards exactly as
// the provider answered, byte for byte (today's main answered the object
// as a JSON string and dropped useragent).
func TestLocalResAnswersAreExact(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startExact(t, "2captcha", prov.URL, "", app)
	for id, answer := range map[string]string{"71000000101": exactAmazonWAF, "71000000102": exactTurnstile} {
		prov.answer("res.php", trkAnswer{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json"}, body: []byte(answer)})
		q := "/res.php?key=" + trkKey + "&action=get&json=1&id=" + id
		first := trkDo(t, http.MethodGet, q, "", nil)
		if string(first.body) != answer {
			t.Fatalf("passed-through answer %q, want the provider's %q", first.body, answer)
		}
		n := len(prov.requests("res.php"))
		local := trkDo(t, http.MethodGet, q, "", nil)
		if local.status != http.StatusOK || string(local.body) != answer {
			t.Errorf("local answer %d %q, want the provider's %q", local.status, local.body, answer)
		}
		if ct := local.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("local answer Content-Type %q", ct)
		}
		if got := len(prov.requests("res.php")); got != n {
			t.Errorf("the local answer reached the provider")
		}
		if rec := getRecord(t, "2captcha", id); string(rec.Answer) != answer {
			t.Errorf("stored answer %q, want the provider's whole answer", rec.Answer)
		}
	}
}

// TestReusedTaskIDIsLogged: a submission whose answer names a task id the
// store already holds is not tracked again, and a warn line says so with
// the id (today's main said nothing).
func TestReusedTaskIDIsLogged(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	prov.answer("in.php", trkAnswer{status: http.StatusOK, body: []byte("OK|71000000401")})
	logFile := startExact(t, "2captcha", prov.URL, "", app)
	submit := func() {
		resp := trkDo(t, http.MethodGet, "/in.php?key="+trkKey+"&method=userrecaptcha&pingback="+url.QueryEscape(trkCallbackURL), "", nil)
		if string(resp.body) != "OK|71000000401" {
			t.Fatalf("submission answered %q", resp.body)
		}
	}
	submit()
	const msg = "submission answered with a task id the store already holds (a reused id): not tracked again"
	if n := len(logEntries(t, logFile, msg)); n != 0 {
		t.Fatalf("%d reuse warnings after the first submission", n)
	}
	submit()
	var entries []map[string]any
	testkit.WaitFor(t, 5*time.Second, "the reuse warning", func() bool {
		entries = logEntries(t, logFile, msg)
		return len(entries) > 0
	})
	if e := entries[0]; e["level"] != "warn" || e["id"] != "71000000401" || e["provider"] != "2captcha" {
		t.Errorf("warning %v, want level warn naming the id and provider", e)
	}
}
