package pingback

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// adminRequest sends method url (a path on the admin endpoint) and returns
// the status and body.
func adminRequest(t *testing.T, method, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+testAdmin+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestAdminParkedVisibleAndReplayable checks what an operator relies on
// after an outage longer than the retries: parked results are listed, and a
// replay by hand delivers them through the same route once the app is back.
func TestAdminParkedVisibleAndReplayable(t *testing.T) {
	app := newAppStub(t)
	app.setStatus(http.StatusServiceUnavailable)
	startCaddy(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))

	for _, id := range []string{"81", "82"} {
		if status, body := postForm(t, testBase+"/cb", "id="+id+"&code=TOKEN-"+id); status != http.StatusOK || body != "OK" {
			t.Fatalf("pingback %s: got %d %q", id, status, body)
		}
	}
	waitFor(t, 5*time.Second, "both results parked", func() bool {
		return getRecord(t, "2captcha", "81").State == store.StateParked && getRecord(t, "2captcha", "82").State == store.StateParked
	})

	status, body := adminRequest(t, http.MethodGet, "/pingback/records?state=parked&provider=2captcha")
	if status != http.StatusOK {
		t.Fatalf("list: %d %s", status, body)
	}
	var page struct {
		Records []store.Record `json:"records"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		t.Fatalf("list body: %v: %s", err, body)
	}
	listed := page.Records
	if len(listed) != 2 || listed[0].ID != "81" || listed[1].ID != "82" || listed[0].Attempts != 2 || listed[0].LastStatus != 503 {
		t.Fatalf("listed %+v, want 81 and 82 parked after 2 attempts with status 503", listed)
	}
	if status, body := adminRequest(t, http.MethodGet, "/pingback/records?state=delivered"); status != http.StatusOK || string(body) != `{"records":[]}`+"\n" {
		t.Errorf("delivered list: %d %s, want an empty page", status, body)
	}
	if status, body := adminRequest(t, http.MethodGet, "/pingback/records?limit=1"); status != http.StatusOK || strings.Count(string(body), `"id"`) != 1 {
		t.Errorf("limit=1: %d %s, want one record", status, body)
	}

	// Still down: a replay by hand is one more attempt, and parks again.
	status, body = adminRequest(t, http.MethodPost, "/pingback/records/2captcha/81/replay")
	var after store.Record
	if status != http.StatusOK || json.Unmarshal(body, &after) != nil || after.State != store.StateParked || after.Attempts != 3 {
		t.Fatalf("replay while down: %d %s, want 200 and parked after 3 attempts", status, body)
	}

	app.setStatus(http.StatusOK)
	status, body = adminRequest(t, http.MethodPost, "/pingback/records/2captcha/81/replay")
	if status != http.StatusOK || json.Unmarshal(body, &after) != nil || after.State != store.StateDelivered || after.Attempts != 4 {
		t.Fatalf("replay: %d %s, want 200 and delivered at attempt 4", status, body)
	}
	reqs := app.requests()
	last := reqs[len(reqs)-1]
	if last.Header.Get(HeaderSource) != "replay" || last.Header.Get(HeaderAttempt) != "4" ||
		last.Header.Get(HeaderIdempotencyKey) != "2captcha:81" || last.Body != "id=81&code=TOKEN-81" {
		t.Errorf("app got %+v, want the original pingback as replay attempt 4", last)
	}
	if n := app.count("2captcha:81"); n != 4 {
		t.Errorf("app saw 2captcha:81 %d times, want 4 (2 automatic, 2 by hand)", n)
	}
	if getRecord(t, "2captcha", "82").State != store.StateParked {
		t.Error("82 left parked: only what the operator replays is replayed")
	}

	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodPost, "/pingback/records/2captcha/999/replay", http.StatusNotFound},
		{http.MethodGet, "/pingback/records/2captcha/81/replay", http.StatusMethodNotAllowed},
		{http.MethodPost, "/pingback/records/2captcha/81", http.StatusMethodNotAllowed},
		{http.MethodPost, "/pingback/records", http.StatusMethodNotAllowed},
		{http.MethodGet, "/pingback/records?state=lost", http.StatusBadRequest},
		{http.MethodGet, "/pingback/records?provider=deathbycaptcha", http.StatusBadRequest},
		{http.MethodGet, "/pingback/records?limit=0", http.StatusBadRequest},
	} {
		if status, body := adminRequest(t, tc.method, tc.path); status != tc.status || !strings.Contains(string(body), `"error"`) {
			t.Errorf("%s %s: %d %s, want %d with an error", tc.method, tc.path, status, body, tc.status)
		}
	}
}

// TestAdminReplayRefusedInFlight checks that a result whose forward is
// under way is not replayed by hand a second time at once.
func TestAdminReplayRefusedInFlight(t *testing.T) {
	app := newAppStub(t)
	release := make(chan struct{})
	app.mu.Lock()
	app.release = release
	app.mu.Unlock()
	defer close(release)
	startCaddy(t, "", pingbackSite("2captcha", "ack_timeout 100ms", app))

	if status, body := postForm(t, testBase+"/cb", "id=91&code=T"); status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback: %d %q", status, body)
	}
	waitFor(t, 5*time.Second, "the app to hold the forward", func() bool { return app.count("2captcha:91") == 1 })
	if status, body := adminRequest(t, http.MethodPost, "/pingback/records/2captcha/91/replay"); status != http.StatusConflict {
		t.Errorf("replay in flight: %d %s, want 409", status, body)
	}
}
