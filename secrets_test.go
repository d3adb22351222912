package pingback

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/store"
)

// adminDo sends a request to the admin endpoint and returns status and
// body.
func adminDo(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+testAdmin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestStoredHeadersAndAdminRedaction sends a pingback carrying credential
// headers through a real Caddy: the app gets every header live; the store
// keeps only the allowlist plus keep_headers; the admin API's answers
// (list, one record, replay) never show a credential's value, even one
// kept by keep_headers; and a replay carries the kept headers.
func TestStoredHeadersAndAdminRedaction(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "keep_headers x-api-key X-Tenant", app))

	secrets := map[string]string{
		"Authorization":       "Bearer sekret-authorization-1",
		"Proxy-Authorization": "Basic sekret-proxy-2",
		"Cookie":              "session=sekret-cookie-3",
		"X-Api-Key":           "sekret-apikey-4",
		"X-Session-Token":     "sekret-session-5",
	}
	req, _ := http.NewRequest(http.MethodPost, testBase+"/cb", strings.NewReader("id=4242&code=TOKEN-4242"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("User-Agent", "2captcha-pingback/1.0")
	req.Header.Set("X-Tenant", "tenant-7")
	for k, v := range secrets {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("pingback answered %d", resp.StatusCode)
	}
	waitFor(t, 5*time.Second, "the live delivery", func() bool { return app.count("2captcha:4242") == 1 })
	live := app.requests()[0]
	for k, v := range secrets {
		if k == "Proxy-Authorization" {
			continue // hop-by-hop: reverse_proxy never passes it on
		}
		if live.Header.Get(k) != v {
			t.Errorf("live delivery: %s = %q, want %q (the live forward carries every header)", k, live.Header.Get(k), v)
		}
	}

	rec := getRecord(t, "2captcha", "4242")
	for _, name := range []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Session-Token"} {
		if _, ok := rec.Request.Header[name]; ok {
			t.Errorf("stored request keeps %s; only the allowlist and keep_headers may be stored", name)
		}
	}
	for name, want := range map[string]string{"Content-Type": "application/x-www-form-urlencoded", "User-Agent": "2captcha-pingback/1.0",
		"X-Tenant": "tenant-7", "X-Api-Key": "sekret-apikey-4"} {
		if got := rec.Request.Header.Get(name); got != want {
			t.Errorf("stored %s = %q, want %q", name, got, want)
		}
	}

	scan := func(what, body string) {
		t.Helper()
		for k, v := range secrets {
			secret := v[strings.Index(v, "sekret"):]
			if strings.Contains(body, secret) {
				t.Errorf("%s shows the %s header's value", what, k)
			}
		}
		if !strings.Contains(body, "tenant-7") || !strings.Contains(body, redactedValue) {
			t.Errorf("%s: want the kept X-Tenant value and %q for X-Api-Key; got %s", what, redactedValue, body)
		}
	}
	for _, path := range []string{"/pingback/records", "/pingback/records?provider=2captcha", "/pingback/records/2captcha/4242"} {
		status, body := adminDo(t, http.MethodGet, path, "")
		if status != 200 {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		scan("GET "+path, body)
	}
	status, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/4242/replay?force=true", "")
	if status != 200 {
		t.Fatalf("replay: %d %s", status, body)
	}
	scan("the replay's answer", body)
	reqs := app.requests()
	replayed := reqs[len(reqs)-1]
	if replayed.Header.Get("X-Api-Key") != "sekret-apikey-4" || replayed.Header.Get("X-Tenant") != "tenant-7" {
		t.Errorf("replay lacks the kept headers: %v", replayed.Header)
	}
	if replayed.Header.Get("Authorization") != "" || replayed.Header.Get("Cookie") != "" {
		t.Errorf("replay carries a header that was not stored: %v", replayed.Header)
	}
}

// TestAdminPathEscapedSegments checks that %2F inside a path segment of
// the admin API is part of the segment, not a separator.
func TestAdminPathEscapedSegments(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	if s, b := postForm(t, testBase+"/cb", "id=77&code=TOKEN-77"); s != 200 {
		t.Fatalf("pingback: %d %s", s, b)
	}
	cases := []struct {
		method, path string
		status       int
		want         string
	}{
		// Split on the decoded path, "77%2Freplay" would be the id 77
		// and the replay action.
		{http.MethodPost, "/pingback/records/2captcha/77%2Freplay", http.StatusMethodNotAllowed, "use GET"},
		{http.MethodGet, "/pingback/records/2captcha/77%2Freplay", http.StatusNotFound, "no stored result 2captcha:77/replay"},
		{http.MethodGet, "/pingback/records/2captcha%2F77", http.StatusNotFound, "not found: use"},
		{http.MethodGet, "/pingback/tasks/2captcha/1%2F2", http.StatusNotFound, "no tracked task 2captcha:1/2"},
		{http.MethodGet, "/pingback/records/2captcha/77", http.StatusOK, `"id":"77"`},
	}
	for _, c := range cases {
		status, body := adminDo(t, c.method, c.path, "")
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s, want %d with %q", c.method, c.path, status, body, c.status, c.want)
		}
	}
	if n := app.count("2captcha:77"); n != 1 {
		t.Errorf("the app got 2captcha:77 %d times, want once (no replay by an escaped path)", n)
	}
}

// TestAdminSubmittedAtRange checks that a task registration's submitted_at
// outside [now - give_up, now] is refused with 400 and stores (and counts)
// nothing, and that one inside is taken.
func TestAdminSubmittedAtRange(t *testing.T) {
	startAdminCaddy(t)
	now := time.Now().UTC()
	tracked := runningApp(t).metrics.tasks.WithLabelValues("2captcha", "tracked")
	before := testutil.ToFloat64(tracked)
	cases := []struct {
		name, id, at string
		status       int
	}{
		{"year 1", "9001", "0001-01-01T00:00:00Z", 400},
		{"1970", "9002", "1970-01-01T00:00:00Z", 400},
		{"just before give_up", "9003", now.Add(-16 * time.Minute).Format(time.RFC3339), 400},
		{"an hour ahead", "9004", now.Add(time.Hour).Format(time.RFC3339), 400},
		{"year 9999", "9005", "9999-12-31T23:59:59Z", 400},
		{"a minute ago", "9006", now.Add(-time.Minute).Format(time.RFC3339), 201},
	}
	for _, c := range cases {
		status, body := adminCall(t, http.MethodPost, adminRegistration(t, map[string]string{
			"provider": "2captcha", "id": c.id, "pingback_url": trkCallbackURL, "submitted_at": c.at}))
		if status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, status, body, c.status)
		}
		_, err := trkTask(t, c.id)
		if (err == nil) != (c.status == 201) {
			t.Errorf("%s: task stored: %v, want %v", c.name, err == nil, c.status == 201)
		}
	}
	if d := testutil.ToFloat64(tracked) - before; d != 1 {
		t.Errorf("tracked tasks (the poller's budget) grew by %v, want 1: refused registrations must not count", d)
	}
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
		if s, b := postForm(t, testBase+"/cb", "id=5150&code=%FF%FE%C3%28ok%80"); s != 200 {
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
	if n := app.count("2captcha:5150"); n != 1 {
		t.Errorf("the app got it %d times, want once", n)
	}
}

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
	const key = "f00dfeedf00dfeedf00dfeedf00dfeed"
	dir := t.TempDir()
	logFile, accessFile := filepath.Join(dir, "caddy.log"), filepath.Join(dir, "access.log")
	// A port that refuses connections: the provider is down.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	app := newAppStub(t)
	cfg := fmt.Sprintf(`{
	admin %s
	http_port %s
	https_port 9443
	grace_period 1ns
	auto_https off
	skip_install_trust
	persist_config off
	log {
		output file %s
		format json
		level DEBUG
	}
	pingback {
		storage_dir %s
		provider 2captcha {
			endpoint http://%s
			api_endpoint http://%s
			api_key %s
		}
		poll {
			after 20s
		}
	}
}
http://localhost:%s {
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
`, testAdmin, testHTTPPort, logFile, filepath.Join(dir, "store"), dead, dead, key, testHTTPPort, accessFile, app.hostPort(), trkCallbackURL, dead)
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
	// A task whose first poll is due now: the poller asks the dead
	// provider's res.php (a POST) and backs off.
	if s, b := adminCall(t, http.MethodPost, adminRegistration(t, map[string]string{"provider": "2captcha", "id": "777001",
		"pingback_url": trkCallbackURL, "submitted_at": time.Now().Add(-30 * time.Second).UTC().Format(time.RFC3339)})); s != 201 {
		t.Fatalf("registering a task: %d %s", s, b)
	}
	errs := runningApp(t).metrics.resphp.WithLabelValues("2captcha", "error")
	before := testutil.ToFloat64(errs)
	waitFor(t, 10*time.Second, "a failed poll of the dead provider", func() bool { return testutil.ToFloat64(errs) > before })
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	waitFor(t, 5*time.Second, "the poller's back-off line", func() bool { return strings.Contains(read(logFile), "provider unavailable for polling") })

	logs, access := read(logFile), read(accessFile)
	for _, want := range []string{`"level":"debug"`, "provider request failed; answered the app itself", "provider unavailable for polling"} {
		if !strings.Contains(logs, want) {
			t.Errorf("Caddy's log lacks %q: the test would not see the lines it checks", want)
		}
	}
	if strings.Count(access, `"uri":"/in.php"`) != 1 {
		t.Errorf("access log: want one in.php line; got:\n%s", access)
	}
	for name, text := range map[string]string{"Caddy's log": logs, "the access log": access} {
		for i, line := range strings.Split(text, "\n") {
			if strings.Contains(line, key) {
				t.Errorf("%s, line %d, holds the API key: %s", name, i+1, line)
			}
		}
	}

	// A GET submission: the key is in the app's own URL.
	resp, err = http.Get(testBase + "/in.php?key=" + key + "&method=userrecaptcha&googlekey=k&pageurl=https://a.example")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	waitFor(t, 5*time.Second, "the GET submission's access line", func() bool { return strings.Count(read(accessFile), `"uri":"/in.php`) == 2 })
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

// TestStartRefusesSharedStorageDir checks that Caddy does not start the
// plugin on a storage_dir that holds a file that is not the store's: the
// config load fails with an error naming the file, and the file and the
// directory's mode stay as they were.
func TestStartRefusesSharedStorageDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "app.sqlite"), []byte("the app's data"), 0o644); err != nil {
		t.Fatal(err)
	}
	app := newAppStub(t)
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileFor("storage_dir "+dir, pingbackSite("2captcha", "", app))), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = caddy.Load(cfg, true)
	t.Cleanup(func() { unloadCaddy(t) })
	if err == nil || !strings.Contains(err.Error(), `"app.sqlite"`) || !strings.Contains(err.Error(), "not one of the store's files") {
		t.Fatalf("load with a shared storage_dir: %v; want an error naming app.sqlite", err)
	}
	if info, _ := os.Stat(dir); info.Mode().Perm() != 0o755 {
		t.Errorf("the refused directory's mode changed to %o", info.Mode().Perm())
	}
}
