package pingback

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// heapAllocs is the process's cumulative heap allocation, in bytes.
func heapAllocs() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// TestTrackMaxAnswerStreams has the provider answer a res.php request with
// 64 MiB: the app receives every byte unchanged, and the process allocates
// far less than the answer on the way (bufferred whole, the answer alone
// would allocate at least 64 MiB, and about twice that as the buffer
// grows).
func TestTrackMaxAnswerStreams(t *testing.T) {
	const size = 64 << 20
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	want := sha256.New()
	for range size / len(chunk) {
		want.Write(chunk)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", fmt.Sprint(size))
		for range size / len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(upstream.Close)
	app := newAppStub(t)
	startCaddy(t, trkGlobal, trkSite("", strings.TrimPrefix(upstream.URL, "http://"), app))

	runtime.GC()
	var peak uint64
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapBefore := ms.HeapInuse
	allocsBefore := heapAllocs()
	resp, err := http.Get(testBase + "/res.php?key=wrong-key&action=get&id=123456&json=1")
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	buf := make([]byte, 64<<10)
	n := int64(0)
	for {
		k, err := resp.Body.Read(buf)
		got.Write(buf[:k])
		n += int64(k)
		if n%(8<<20) < int64(k) {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading the answer after %d bytes: %v", n, err)
		}
	}
	resp.Body.Close()
	allocated := heapAllocs() - allocsBefore
	if resp.StatusCode != 200 || n != size || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("the app got status %d and %d bytes (sha256 equal: %v), want 200 and the %d bytes unchanged",
			resp.StatusCode, n, bytes.Equal(got.Sum(nil), want.Sum(nil)), size)
	}
	growth := int64(peak) - int64(heapBefore)
	t.Logf("64 MiB answer: %.1f MiB allocated on the way, heap in use grew by at most %.1f MiB", float64(allocated)/(1<<20), float64(growth)/(1<<20))
	if allocated > 16<<20 {
		t.Errorf("passing a 64 MiB answer allocated %d MiB; bounded buffering (max_answer 1 MiB) keeps it under 16 MiB", allocated>>20)
	}
	if growth > 16<<20 {
		t.Errorf("heap in use grew by %d MiB while the answer passed; want well under the 64 MiB answer", growth>>20)
	}
	if _, err := runningApp(t).store(time.Second).Get(t.Context(), store.Key{Provider: "2captcha", ID: "123456"}); err == nil {
		t.Error("a result was stored from an answer over max_answer")
	}
}

// TestNoKeyInDebugLogs runs Caddy at debug level, with the access log
// filter of docs/security.md, through a provider outage: the app's POST
// submissions and result requests (key and clientKey in the bodies) and the poller's own
// res.php requests all fail, and no log line (the plugin's, Caddy's error
// log, reverse_proxy's debug lines, the access log) holds the key. The
// plugin's own line for each failure is there, redacted. A GET submission
// afterwards (the key in the app's own URL) shows where docs/security.md says
// the key still appears: reverse_proxy's debug lines only.
func TestNoKeyInDebugLogs(t *testing.T) {
	// Two accounts: every request below is made with each key.
	const key, key2 = "f00dfeedf00dfeedf00dfeedf00dfeed", "c0ffeec0ffeec0ffeec0ffeec0ffee02"
	dir := t.TempDir()
	logFile, accessFile := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log")
	// A port that refuses connections: the provider is down.
	dead := "127.0.0.1:" + testkit.UnusedLoopbackPort(t)
	app := newAppStub(t)
	g := testGlobals(fmt.Sprintf("storage_dir %s\nprovider 2captcha {\n\tendpoint http://%s\n\tapi_endpoint http://%s\n\tapi_key %s %s\n}\npoll {\n\tafter 20s\n}",
		filepath.Join(dir, "store"), dead, dead, key, key2))
	g.LogFile, g.LogLevel = logFile, "DEBUG"
	cfg := g.Caddyfile(fmt.Sprintf(`http://localhost:%s {
	log {
		output file %s
		format filter {
			wrap json
			request>uri query {
				delete key
				delete clientKey
				replace code REDACTED
			}
		}
	}
	handle /cb {
		pingback {
			provider 2captcha
		}
		reverse_proxy %s
	}
	handle {
		pingback_track {
			provider 2captcha
			pingback_url %s
		}
		reverse_proxy %s
	}
}
`, testHTTPPort, accessFile, app.HostPort(), trkCallbackURL, dead))
	loadCaddyfile(t, cfg)
	t.Cleanup(func() { unloadCaddy(t) })

	form := func(path, body string) int {
		t.Helper()
		resp, err := http.Post(testBase+path, "application/x-www-form-urlencoded", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, key := range []string{key, key2} {
		if s := form("/in.php", "key="+key+"&method=userrecaptcha&googlekey=k&pageurl=https://a.example&json=1"); s != http.StatusBadGateway {
			t.Errorf("in.php with the provider down: %d, want 502", s)
		}
		if s := form("/res.php", "key="+key+"&action=get&id=123456&json=1"); s != http.StatusBadGateway {
			t.Errorf("res.php with the provider down: %d, want 502", s)
		}
		resp, err := http.Post(testBase+"/createTask", "application/json", strings.NewReader(`{"clientKey":"`+key+`","task":{"type":"RecaptchaV2TaskProxyless","websiteURL":"https://a.example","websiteKey":"k"}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("createTask with the provider down: %d, want 502", resp.StatusCode)
		}
	}
	// A task whose first poll is due now: the poller asks the dead
	// provider's res.php (a POST) and backs off.
	if s, b := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{"provider": "2captcha", "id": "777001",
		"account": accountID("2captcha", key2), "pingback_url": trkCallbackURL, "submitted_at": time.Now().Add(-30 * time.Second).UTC().Format(time.RFC3339)})); s != 201 {
		t.Fatalf("registering a task: %d %s", s, b)
	}
	errs := runningApp(t).metrics.resphp.WithLabelValues("2captcha", "error")
	before := testutil.ToFloat64(errs)
	testkit.WaitFor(t, 10*time.Second, "a failed poll of the dead provider", func() bool { return testutil.ToFloat64(errs) > before })
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	testkit.WaitFor(t, 5*time.Second, "the poller's back-off line", func() bool { return strings.Contains(read(logFile), "provider unavailable for polling") })

	logs, access := read(logFile), read(accessFile)
	for _, want := range []string{`"level":"debug"`, "provider request failed; answered the app itself", "provider unavailable for polling"} {
		if !strings.Contains(logs, want) {
			t.Errorf("Caddy's log lacks %q: the test would not see the lines it checks", want)
		}
	}
	if strings.Count(access, `"uri":"/in.php"`) != 2 {
		t.Errorf("access log: want two in.php lines; got:\n%s", access)
	}
	for name, text := range map[string]string{"Caddy's log": logs, "the access log": access} {
		for i, line := range strings.Split(text, "\n") {
			if strings.Contains(line, key) || strings.Contains(line, key2) {
				t.Errorf("%s, line %d, holds an API key: %s", name, i+1, line)
			}
		}
	}

	// A GET submission: the key is in the app's own URL.
	resp, err := http.Get(testBase + "/in.php?key=" + key + "&method=userrecaptcha&googlekey=k&pageurl=https://a.example")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	testkit.WaitFor(t, 5*time.Second, "the GET submission's access line", func() bool { return strings.Count(read(accessFile), `"uri":"/in.php`) == 3 })
	for i, line := range strings.Split(read(logFile), "\n") {
		if !strings.Contains(line, key) {
			continue
		}
		var l struct {
			Level  string `json:"level"`
			Logger string `json:"logger"`
		}
		_ = json.Unmarshal([]byte(line), &l)
		if l.Level != "debug" || l.Logger != "http.handlers.reverse_proxy" {
			t.Errorf("GET submission: line %d holds the key outside reverse_proxy's debug lines: %s", i+1, line)
		}
	}
	if strings.Contains(read(accessFile), key) {
		t.Error("GET submission: the filtered access log holds the key")
	}
}
