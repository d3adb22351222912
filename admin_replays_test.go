package pingback

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestBulkReplay replays 1000 parked results in one job: each is delivered
// once, the app never has more than concurrency of them in flight, and the
// job reports its progress.
func TestBulkReplay(t *testing.T) {
	app := newAppStub(t)
	app.Tune(func() { app.Delay = 2 * time.Millisecond }) // so that forwards overlap
	startCaddy(t, "replay {\n\tbackoff 20ms 40ms\n\tconcurrency 3\n}", pingbackSite("captchaai", "", app))
	const n = 1000
	for i := range n {
		insertRecord(t, storedCallback(t, fmt.Sprint(20000+i), store.StateParked, 5, time.Time{}))
	}
	// One failed result of another kind: not in the job.
	insertRecord(t, storedCallback(t, "29999", store.StateRejected, 1, time.Time{}))

	a := testkit.Admin(testAdmin).Do(t, http.MethodPost, "/pingback/replays", `{"provider": "captchaai"}`)
	status, loc, body := a.Status, a.Header.Get("Location"), a.Body
	var job adminapi.ReplayJobState
	if status != http.StatusAccepted || json.Unmarshal(body, &job) != nil || job.Status != "running" || job.Matched != n ||
		loc != "/pingback/replays/"+job.ID {
		t.Fatalf("POST /pingback/replays: %d %q %s, want 202, running, %d matched, Location of the job", status, loc, body, n)
	}
	testkit.WaitFor(t, 60*time.Second, "the job done", func() bool {
		code, b := adminDo(t, http.MethodGet, loc, "")
		return code == http.StatusOK && json.Unmarshal(b, &job) == nil && job.Status == "done"
	})
	if job.Matched != n || job.Done != n || job.Delivered != n || job.Failed != 0 {
		t.Errorf("job %+v, want %d matched, done and delivered", job, n)
	}
	for i := range n {
		if c := app.Count(fmt.Sprint("captchaai:", 20000+i)); c != 1 {
			t.Fatalf("captchaai:%d delivered %d times, want once", 20000+i, c)
		}
	}
	if c := app.Count("captchaai:29999"); c != 0 {
		t.Errorf("the rejected result was replayed %d times, want never", c)
	}
	if peak := app.PeakInflight(); peak > 3 || peak < 2 {
		t.Errorf("the app had at most %d bulk replays in flight, want up to concurrency (3), overlapping", peak)
	}
	if v, _ := scrapeMetric(t, `caddy_pingback_records{provider="captchaai",state="delivered"}`); v != n {
		t.Errorf("records{delivered} = %v, want %d", v, n)
	}
}

// TestBulkReplayCancelAndBadInput checks DELETE (the job ends cancelled
// with the rest left parked) and the errors.
func TestBulkReplayCancelAndBadInput(t *testing.T) {
	app := newAppStub(t)
	release := make(chan struct{})
	app.Tune(func() { app.Release = release })
	startCaddy(t, "replay {\n\tconcurrency 1\n}", pingbackSite("captchaai", "", app))
	for i := range 5 {
		insertRecord(t, storedCallback(t, fmt.Sprint(30000+i), store.StateParked, 5, time.Time{}))
	}
	a := testkit.Admin(testAdmin).Do(t, http.MethodPost, "/pingback/replays", `{"state": "parked", "received_before": "`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`)
	status, loc, body := a.Status, a.Header.Get("Location"), a.Body
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %s", status, body)
	}
	testkit.WaitFor(t, 5*time.Second, "the first replay held by the app", func() bool { return app.Count("captchaai:30000") == 1 })
	var job adminapi.ReplayJobState
	if code, b := adminDo(t, http.MethodDelete, loc, ""); code != http.StatusOK || json.Unmarshal(b, &job) != nil {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	close(release)
	testkit.WaitFor(t, 5*time.Second, "the job cancelled", func() bool {
		code, b := adminDo(t, http.MethodGet, loc, "")
		return code == http.StatusOK && json.Unmarshal(b, &job) == nil && job.Status == "cancelled"
	})
	if job.Done != 1 || job.Matched != 5 {
		t.Errorf("cancelled job %+v, want 5 matched and only the one in flight done", job)
	}
	if getRecord(t, "captchaai", "30004").State != store.StateParked {
		t.Error("a result after the cancel was replayed")
	}

	// A filter excluding everything by time matches nothing and is done.
	a = testkit.Admin(testAdmin).Do(t, http.MethodPost, "/pingback/replays", `{"received_after": "`+time.Now().Add(time.Hour).UTC().Format(time.RFC3339)+`"}`)
	status, loc, body = a.Status, a.Header.Get("Location"), a.Body
	if status != http.StatusAccepted || json.Unmarshal(body, &job) != nil || job.Matched != 0 {
		t.Fatalf("POST with an empty match: %d %s", status, body)
	}
	testkit.WaitFor(t, 5*time.Second, "the empty job done", func() bool {
		_, b := adminDo(t, http.MethodGet, loc, "")
		return json.Unmarshal(b, &job) == nil && job.Status == "done"
	})

	for _, tc := range []struct {
		method, path, body string
		status             int
	}{
		{http.MethodPost, "/pingback/replays", `{"state": "lost"}`, http.StatusBadRequest},
		{http.MethodPost, "/pingback/replays", `{"state": "delivered"}`, http.StatusBadRequest},
		{http.MethodPost, "/pingback/replays", `{"provider": "deathbycaptcha"}`, http.StatusBadRequest},
		{http.MethodPost, "/pingback/replays", `{"received_after": "yesterday"}`, http.StatusBadRequest},
		{http.MethodPost, "/pingback/replays", `{"colour": "red"}`, http.StatusBadRequest},
		{http.MethodPost, "/pingback/replays", `[`, http.StatusBadRequest},
		{http.MethodGet, "/pingback/replays", ``, http.StatusMethodNotAllowed},
		{http.MethodGet, "/pingback/replays/0123456789abcdef", ``, http.StatusNotFound},
		{http.MethodPut, loc, ``, http.StatusMethodNotAllowed},
		{http.MethodGet, "/pingback/replays/", ``, http.StatusNotFound},
	} {
		if code, b := adminDo(t, tc.method, tc.path, tc.body); code != tc.status || !bytes.Contains(b, []byte(`"error"`)) {
			t.Errorf("%s %s %s: %d %s, want %d with an error", tc.method, tc.path, tc.body, code, b, tc.status)
		}
	}
}

// TestBulkReplayOutlivesAReload: a config reload cancels a running bulk
// replay (status cancelled), and the new config's admin API still answers
// the job: jobs belong to the process, not to the config that started
// them.
func TestBulkReplayOutlivesAReload(t *testing.T) {
	app := newAppStub(t)
	release := make(chan struct{})
	app.Tune(func() { app.Release = release })
	global := "replay {\n\tconcurrency 1\n}"
	dir := startCaddy(t, global, pingbackSite("captchaai", "", app))
	for i := range 3 {
		insertRecord(t, storedCallback(t, fmt.Sprint(31000+i), store.StateParked, 5, time.Time{}))
	}
	a := testkit.Admin(testAdmin).Do(t, http.MethodPost, "/pingback/replays", `{"provider": "captchaai"}`)
	loc := a.Header.Get("Location")
	if a.Status != http.StatusAccepted {
		t.Fatalf("POST: %d %s", a.Status, a.Body)
	}
	testkit.WaitFor(t, 5*time.Second, "the first replay held by the app", func() bool { return app.Count("captchaai:31000") == 1 })
	old := runningApp(t)
	loadCaddyfile(t, caddyfileFor("storage_dir "+dir+"\n"+global, pingbackSite("captchaai", "", app)))
	if runningApp(t) == old {
		t.Fatal("the config was not reloaded")
	}
	close(release)
	var job adminapi.ReplayJobState
	testkit.WaitFor(t, 10*time.Second, "the job cancelled by the reload", func() bool {
		code, b := adminDo(t, http.MethodGet, loc, "")
		return code == http.StatusOK && json.Unmarshal(b, &job) == nil && job.Status == "cancelled"
	})
	if job.Matched != 3 || job.Done != 1 {
		t.Errorf("job after the reload %+v, want 3 matched and only the one in flight done", job)
	}
}
