package captchasim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// FuzzRequest feeds arbitrary requests to in.php and res.php and checks the
// handler never panics and always answers with a protocol body, an injected
// HTML error page or a routing status. It runs in-process (no network):
// tasks are never solved, so no pingback is ever sent to fuzzed URLs.
func FuzzRequest(f *testing.F) {
	multipartBody := "--XX\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\n" + testKey +
		"\r\n--XX\r\nContent-Disposition: form-data; name=\"method\"\r\n\r\npost\r\n" +
		"--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.png\"\r\n\r\nPNGDATA\r\n--XX--\r\n"
	seeds := []struct {
		endpoint    uint8
		method      string
		query       string
		contentType string
		body        string
	}{
		{0, "GET", "key=" + testKey + "&method=userrecaptcha&json=1", "", ""},
		{0, "POST", "", "application/x-www-form-urlencoded", "key=" + testKey + "&method=base64&body=iVBORw0KGgo%3D"},
		{0, "POST", "json=1", "multipart/form-data; boundary=XX", multipartBody},
		{0, "POST", "", "multipart/form-data; boundary=XX", "--XX\r\ngarbage"},
		{0, "POST", "", "multipart/form-data", "no boundary"},
		{0, "GET", "key=" + testKey + "&method=hcaptcha&pingback=http://%zz", "", ""},
		{0, "POST", "%%%&&&==", "application/x-www-form-urlencoded", "%zz=%zz&;;;"},
		{1, "GET", "key=" + testKey + "&action=get&ids=1,2,,3&json=1", "", ""},
		{1, "GET", "key=" + testKey + "&action=get2&id=10000000000", "", ""},
		{1, "POST", "", "application/x-www-form-urlencoded", "key=" + testKey + "&action=reportbad&id=99999999999999999999999"},
		{1, "GET", "action=getbalance", "", ""},
		{1, "GET", "key=" + otherKey + "&action=get&ids=1," + otherKey + "&json=1", "", ""},
		{0, "POST", "", "application/x-www-form-urlencoded", "key=" + bannedKey + "&method=userrecaptcha"},
		{1, "POST", "json=1", "application/x-www-form-urlencoded", "key=" + bannedKey + "&action=get&id=10000000000"},
		{2, "GET", "", "", ""},
		{0, "PATCH", "", "text/plain", "x"},
	}
	for _, s := range seeds {
		f.Add(s.endpoint, s.method, s.query, s.contentType, []byte(s.body))
	}

	sim, err := New(Config{
		Key: testKey, Keys: []string{otherKey, bannedKey}, SolveMin: never, SolveMax: never,
		ServerErrorRate: 0.1, NoSlotRate: 0.1, BulkMismatchRate: 0.5,
		SubmitServerErrorRate: 0.05, SubmitNoSlotRate: 0.05,
		EnforceBudget: true, BudgetAllowance: 50,
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = sim.Close() })
	if err := sim.BanKey(bannedKey); err != nil {
		f.Fatal(err)
	}
	paths := []string{"/in.php", "/res.php", "/stats", "/x"}

	f.Fuzz(func(t *testing.T, endpoint uint8, method, query, contentType string, body []byte) {
		req, err := http.NewRequest(http.MethodGet, "http://sim"+paths[int(endpoint)%len(paths)], nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Method = method
		req.URL.RawQuery = query
		req.Header.Set("Content-Type", contentType)
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))

		rec := httptest.NewRecorder()
		sim.ServeHTTP(rec, req)

		switch rec.Code {
		case http.StatusOK:
			out := rec.Body.String()
			if out == "" {
				t.Fatalf("empty 200 answer")
			}
			if strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") && !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("invalid JSON answer %q", out)
			}
		case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable:
			if !strings.Contains(rec.Body.String(), "<html>") {
				t.Fatalf("5xx without an HTML page: %q", rec.Body.String())
			}
		case http.StatusNotFound, http.StatusMethodNotAllowed:
		default:
			t.Fatalf("unexpected status %d", rec.Code)
		}
	})
}

// FuzzBulkIDs checks bulk answers always carry one element per id (no
// mismatch injection) or a whole-request error code, and that an id of the
// other account's task is always an unknown id.
func FuzzBulkIDs(f *testing.F) {
	f.Add("1,2,3", false)
	f.Add(",", false)
	f.Add(" 10000000000 ,x", true)
	f.Add("", false)
	sim, err := New(Config{Key: testKey, Keys: []string{otherKey}, SolveMin: never, SolveMax: never, ForgetAfter: -1})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = sim.Close() })
	now := time.Now()
	sim.mu.Lock()
	owned := [2]string{
		sim.newTaskLocked(sim.accounts[0], "hcaptcha", "", now, false).id,
		sim.newTaskLocked(sim.accounts[1], "hcaptcha", "", now, false).id,
	}
	sim.mu.Unlock()
	f.Add(owned[0]+","+owned[1], false)
	f.Add(owned[1]+", "+owned[0]+","+owned[1], true)

	f.Fuzz(func(t *testing.T, ids string, asOther bool) {
		asking := 0
		if asOther {
			asking = 1
		}
		sim.mu.Lock()
		res := sim.bulkGetLocked(sim.accounts[asking], ids, now)
		sim.mu.Unlock()
		if !res.ok {
			if res.text != CodeWrongIDFormat {
				t.Fatalf("bulk %q failed with %q", ids, res.text)
			}
			return
		}
		parts := strings.Split(ids, ",")
		elems := strings.Split(res.text, "|")
		if len(elems) != len(parts) {
			t.Fatalf("bulk %q: %d elements for %d ids: %q", ids, len(elems), len(parts), res.text)
		}
		for i, p := range parts {
			want := CodeWrongCaptchaID
			if strings.TrimSpace(p) == owned[asking] {
				want = CodeNotReady
			}
			if elems[i] != want {
				t.Fatalf("bulk %q element %d = %q, want %q", ids, i, elems[i], want)
			}
		}
	})
}
