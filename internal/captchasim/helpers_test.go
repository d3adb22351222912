package captchasim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// testKey is the key every test sim uses.
const testKey = "0123456789abcdef0123456789abcdef"

// otherKey and bannedKey are the further accounts of multi-account tests.
const (
	otherKey  = "fedcba9876543210fedcba9876543210"
	bannedKey = "00000000111111112222222233333333"
)

// never is a solve delay long enough that timers never fire during a test.
const never = time.Hour

// startSim starts a Sim on a loopback httptest server. Cleanup closes the
// Sim (waiting for pingbacks) and then the server.
func startSim(t *testing.T, cfg Config) (*Sim, string) {
	t.Helper()
	if cfg.Key == "" {
		cfg.Key = testKey
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = s.Close() })
	return s, srv.URL
}

// httpClient has a timeout so a broken test fails instead of hanging.
var httpClient = &http.Client{Timeout: 5 * time.Second}

// response is a finished HTTP exchange.
type response struct {
	status int
	ctype  string
	body   string
}

// do sends req and reads the whole answer.
func do(t *testing.T, req *http.Request) response {
	t.Helper()
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return response{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), body: string(b)}
}

// get sends GET base+"/"+endpoint?vals.
func get(t *testing.T, base, endpoint string, vals url.Values) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/"+endpoint+"?"+vals.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return do(t, req)
}

// postForm sends an application/x-www-form-urlencoded POST.
func postForm(t *testing.T, base, endpoint string, vals url.Values) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/"+endpoint, strings.NewReader(vals.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return do(t, req)
}

// postMultipart sends a multipart/form-data POST with an optional "file"
// upload.
func postMultipart(t *testing.T, base, endpoint string, vals url.Values, file []byte) response {
	t.Helper()
	var fields []string
	for k, vs := range vals {
		for _, v := range vs {
			fields = append(fields, k, v)
		}
	}
	ctype, body := testkit.Multipart(t, file, fields...)
	req, err := http.NewRequest(http.MethodPost, base+"/"+endpoint, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ctype)
	return do(t, req)
}

// submit submits a task by GET with method and optional extra params, and
// returns its id. It fails the test unless the answer is OK|<id>.
func submit(t *testing.T, base, method string, extra url.Values) string {
	t.Helper()
	vals := url.Values{"key": {testKey}, "method": {method}}
	for k, v := range extra {
		vals[k] = v
	}
	if method == "base64" && vals.Get("body") == "" {
		vals.Set("body", "iVBORw0KGgo=")
	}
	r := get(t, base, "in.php", vals)
	id, ok := strings.CutPrefix(r.body, "OK|")
	if r.status != http.StatusOK || !ok || !isDigits(id) {
		t.Fatalf("submit %s: status %d body %q", method, r.status, r.body)
	}
	return id
}

// res calls res.php by GET with the test key.
func res(t *testing.T, base string, vals url.Values) response {
	t.Helper()
	vals.Set("key", testKey)
	return get(t, base, "res.php", vals)
}

// jsonReply decodes a json=1 answer.
type jsonReply struct {
	Status  int             `json:"status"`
	Request json.RawMessage `json:"request"`
	Price   string          `json:"price"`
}

// decodeReply decodes body as a json=1 answer.
func decodeReply(t *testing.T, body string) jsonReply {
	t.Helper()
	var r jsonReply
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("decoding %q: %v", body, err)
	}
	return r
}

// requestString returns the request field of a JSON reply as a string,
// failing if it is not a JSON string.
func (r jsonReply) requestString(t *testing.T) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(r.Request, &s); err != nil {
		t.Fatalf("request %s is not a string: %v", r.Request, err)
	}
	return s
}

// hit is one request a receiver got.
type hit struct {
	method, path, rawQuery, ctype string
	id, code                      string
	at                            time.Time
}

// receiver is a loopback pingback endpoint that records every request.
type receiver struct {
	url    string
	status int

	mu   sync.Mutex
	hits []hit
}

// startReceiver starts a receiver answering status (200 if zero). It is
// closed after the Sim because Cleanup runs in reverse order and receivers
// are started first.
func startReceiver(t *testing.T, status int) *receiver {
	t.Helper()
	if status == 0 {
		status = http.StatusOK
	}
	rc := &receiver{status: status}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h := hit{
			method: r.Method, path: r.URL.Path, rawQuery: r.URL.RawQuery,
			ctype: r.Header.Get("Content-Type"),
			id:    r.Form.Get("id"), code: r.Form.Get("code"), at: time.Now(),
		}
		rc.mu.Lock()
		rc.hits = append(rc.hits, h)
		rc.mu.Unlock()
		w.WriteHeader(rc.status)
	}))
	t.Cleanup(srv.Close)
	rc.url = srv.URL
	return rc
}

// got returns a copy of the recorded hits.
func (rc *receiver) got() []hit {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]hit(nil), rc.hits...)
}

// count returns how many hits the receiver recorded.
func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.hits)
}

// newFakeClock returns a clock at a fixed instant that moves only when
// the test advances it.
func newFakeClock() *testkit.Clock {
	return testkit.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}
