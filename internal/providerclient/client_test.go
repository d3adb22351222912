package providerclient

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

const testKey = "s3cr3t-key"

// seen is one request a test provider received.
type seen struct {
	method, path, rawQuery, contentType, accept, body string
}

// provider serves answer with status to every request and records them.
func provider(t *testing.T, status int, answer string) (string, func() []seen) {
	t.Helper()
	var mu sync.Mutex
	var got []seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), r.Header.Get("Accept"), string(b)})
		mu.Unlock()
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() []seen {
		mu.Lock()
		defer mu.Unlock()
		return append([]seen(nil), got...)
	}
}

// TestResPHPGet pins the res.php request (GET query or POST form, id or
// comma-joined ids) and that its answer is classified per id.
func TestResPHPGet(t *testing.T) {
	for _, tc := range []struct {
		name, method string
		ids          []string
		answer       string
		wantMethod   string
		wantParams   string
		wantKinds    []protocol.Kind
	}{
		{"get one", "", []string{"7"}, `{"status":1,"request":"tok"}`,
			http.MethodGet, "action=get&id=7&json=1&key=" + testKey, []protocol.Kind{protocol.Result}},
		{"get several", http.MethodGet, []string{"7", "8"}, `{"status":1,"request":"tok|CAPCHA_NOT_READY"}`,
			http.MethodGet, "action=get&ids=7%2C8&json=1&key=" + testKey, []protocol.Kind{protocol.Result, protocol.NotReady}},
		{"post one", http.MethodPost, []string{"7"}, `{"status":0,"request":"CAPCHA_NOT_READY"}`,
			http.MethodPost, "action=get&id=7&json=1&key=" + testKey, []protocol.Kind{protocol.NotReady}},
		{"post several", http.MethodPost, []string{"7", "8", "9"}, `{"status":1,"request":"a|b|c"}`,
			http.MethodPost, "action=get&ids=7%2C8%2C9&json=1&key=" + testKey, []protocol.Kind{protocol.Result, protocol.Result, protocol.Result}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base, requests := provider(t, http.StatusOK, tc.answer)
			c := &ResPHP{Endpoint: base, Key: testKey, Method: tc.method, HTTP: http.DefaultClient}
			answers, err := c.Get(t.Context(), tc.ids)
			if err != nil {
				t.Fatal(err)
			}
			if len(answers) != len(tc.wantKinds) {
				t.Fatalf("%d answers, want %d", len(answers), len(tc.wantKinds))
			}
			for i, a := range answers {
				if a.Kind != tc.wantKinds[i] {
					t.Errorf("answer %d is %s, want %s", i, a.Kind, tc.wantKinds[i])
				}
			}
			r := requests()
			if len(r) != 1 {
				t.Fatalf("%d requests, want 1", len(r))
			}
			got := r[0]
			if got.method != tc.wantMethod || got.path != "/res.php" {
				t.Errorf("asked %s %s, want %s /res.php", got.method, got.path, tc.wantMethod)
			}
			params, inURL := got.rawQuery, true
			if tc.wantMethod == http.MethodPost {
				params, inURL = got.body, false
				if got.rawQuery != "" || got.contentType != "application/x-www-form-urlencoded" {
					t.Errorf("POST with query %q and Content-Type %q, want none and a form", got.rawQuery, got.contentType)
				}
			}
			if params != tc.wantParams {
				t.Errorf("parameters %q, want %q", params, tc.wantParams)
			}
			if strings.Contains(got.rawQuery, testKey) != inURL {
				t.Errorf("key in the URL: %v, want %v", !inURL, inURL)
			}
		})
	}
}

// TestTaskResultGet pins the getTaskResult request: a JSON POST of the
// provider's own body (a numeric task id as a number) asking for JSON.
func TestTaskResultGet(t *testing.T) {
	prov, ok := protocol.Lookup("anticaptcha")
	if !ok {
		t.Fatal("no anticaptcha provider")
	}
	base, requests := provider(t, http.StatusOK, `{"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"tok"}}`)
	c := &TaskResult{Provider: prov, Endpoint: base, Key: testKey, HTTP: http.DefaultClient}
	ans, err := c.Get(t.Context(), "7654321")
	if err != nil {
		t.Fatal(err)
	}
	if ans.Kind != protocol.Result || ans.Code != `{"gRecaptchaResponse":"tok"}` {
		t.Errorf("answer %s %q, want a result with the solution", ans.Kind, ans.Code)
	}
	r := requests()
	if len(r) != 1 {
		t.Fatalf("%d requests, want 1", len(r))
	}
	want := seen{http.MethodPost, "/getTaskResult", "", "application/json", "application/json",
		`{"clientKey":"` + testKey + `","taskId":7654321}`}
	if r[0] != want {
		t.Errorf("request %+v, want %+v", r[0], want)
	}
}

// TestCallErrors: a non-200 status, a body that is not the protocol's and
// a transport error are errors named after the API, and none carries the
// key.
func TestCallErrors(t *testing.T) {
	prov, _ := protocol.Lookup("capmonster")
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, tc := range []struct {
		name, api string
		status    int
		answer    string
		closed    bool
		want      string
		protocol  bool // wraps protocol.ErrNotProtocol
	}{
		{"res.php status", "res.php", http.StatusBadGateway, "<html>502</html>", false, "res.php: HTTP 502", false},
		{"res.php not protocol", "res.php", http.StatusOK, "<html>hi</html>", false, "res.php: not a protocol answer", true},
		{"res.php transport", "res.php", 0, "", true, "res.php: ", false},
		{"getTaskResult status", "getTaskResult", http.StatusServiceUnavailable, "", false, "getTaskResult: HTTP 503", false},
		{"getTaskResult not protocol", "getTaskResult", http.StatusOK, `{"status":"ready"}`, false, "getTaskResult: not a protocol answer", true},
		{"getTaskResult transport", "getTaskResult", 0, "", true, "getTaskResult: ", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := closed.URL
			if !tc.closed {
				base, _ = provider(t, tc.status, tc.answer)
			}
			var err error
			if tc.api == "res.php" {
				// GET: the key is in the URL a transport error quotes.
				_, err = (&ResPHP{Endpoint: base, Key: testKey, HTTP: http.DefaultClient}).Get(t.Context(), []string{"7"})
			} else {
				_, err = (&TaskResult{Provider: prov, Endpoint: base, Key: testKey, HTTP: http.DefaultClient}).Get(t.Context(), "7")
			}
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error %v, want one starting %q", err, tc.want)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Errorf("error %q carries the key", err)
			}
			if errors.Is(err, protocol.ErrNotProtocol) != tc.protocol {
				t.Errorf("error %q wraps ErrNotProtocol: %v, want %v", err, !tc.protocol, tc.protocol)
			}
			if tc.closed && tc.api == "res.php" && !strings.Contains(err.Error(), "REDACTED") {
				t.Errorf("transport error %q does not show where the key was redacted", err)
			}
		})
	}
}

// TestAnswerLimit: an answer is read up to MaxAnswer bytes and no further.
func TestAnswerLimit(t *testing.T) {
	long := `{"status":1,"request":"` + strings.Repeat("a", MaxAnswer) + `"}`
	base, _ := provider(t, http.StatusOK, long)
	_, err := (&ResPHP{Endpoint: base, Key: testKey, HTTP: http.DefaultClient}).Get(t.Context(), []string{"7"})
	if !errors.Is(err, protocol.ErrNotProtocol) || !strings.Contains(err.Error(), "(1048576 bytes)") {
		t.Errorf("an answer over MaxAnswer: %v, want it cut at %d bytes and not a protocol answer", err, MaxAnswer)
	}
}

// TestRedactKey: the key is replaced wherever it occurs; an error without
// it, or an empty key, leaves the error as it is.
func TestRedactKey(t *testing.T) {
	orig := errors.New("Get \"https://p/res.php?key=k1&x=k1\": dial tcp: refused")
	if got := redactKey(orig, "k1").Error(); got != "Get \"https://p/res.php?key=REDACTED&x=REDACTED\": dial tcp: refused" {
		t.Errorf("redacted %q", got)
	}
	for _, key := range []string{"", "absent"} {
		if got := redactKey(orig, key); got != orig {
			t.Errorf("key %q: %v, want the error itself", key, got)
		}
	}
}
