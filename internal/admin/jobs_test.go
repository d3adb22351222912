package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// parkedStore holds n parked results of 2captcha.
func parkedStore(n int) *fakeStore {
	st := &fakeStore{records: map[store.Key]*store.Record{}}
	for i := range n {
		r := &store.Record{Provider: "2captcha", ID: string(rune('a' + i))}
		r.State = store.StateParked
		st.records[r.Key()] = r
	}
	return st
}

// jobOf reads GET /pingback/replays/<id> of api.
func jobOf(t *testing.T, api *API, id string) (int, adminapi.ReplayJobState) {
	t.Helper()
	var j adminapi.ReplayJobState
	code, body := serve(t, api, http.MethodGet, "/pingback/replays/"+id, "")
	if code == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &j); err != nil {
			t.Fatal(err)
		}
	}
	return code, j
}

// TestJobsOutliveAReload: a job started through one config's routes is
// answered by the next config's (the State is the process's), cancelled
// when the app that ran it stops; a finished job is forgotten an hour
// after it ended.
func TestJobsOutliveAReload(t *testing.T) {
	state := NewState()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	state.Jobs.now = func() time.Time { return now }
	stopOld, cancel := context.WithCancel(context.Background())
	old := &fakeBackend{ready: true, st: parkedStore(3), jobCtx: stopOld, hold: make(chan struct{})}
	code, body := serve(t, newTestAPI(old, state), http.MethodPost, "/pingback/replays", `{"provider":"2captcha"}`)
	var started adminapi.ReplayJobState
	if code != http.StatusAccepted || json.Unmarshal([]byte(body), &started) != nil || started.Matched != 3 || started.Status != "running" || len(started.ID) != 16 {
		t.Fatalf("POST /pingback/replays: %d %s, want 202, running, 3 matched, a 16-digit id", code, body)
	}
	old.hold <- struct{}{} // one replayed

	reloaded := newTestAPI(&fakeBackend{ready: true, st: parkedStore(0)}, state)
	cancel() // the old app stops
	var j adminapi.ReplayJobState
	testkit.WaitFor(t, 5*time.Second, "the job cancelled", func() bool {
		code, j = jobOf(t, reloaded, started.ID)
		state.Jobs.mu.Lock()
		_, ended := state.Jobs.ended[started.ID]
		state.Jobs.mu.Unlock()
		return code == http.StatusOK && j.Status == "cancelled" && ended
	})
	if j.Done != 1 || j.Delivered != 1 || j.Matched != 3 {
		t.Errorf("the cancelled job %+v, want 3 matched and 1 done and delivered", j)
	}
	now = now.Add(replayJobKept)
	if code, _ := jobOf(t, reloaded, started.ID); code != http.StatusOK {
		t.Errorf("an hour after it ended: %d, want the job still", code)
	}
	now = now.Add(time.Second)
	if code, _ := jobOf(t, reloaded, started.ID); code != http.StatusNotFound {
		t.Errorf("over an hour after it ended: %d, want 404", code)
	}
}

// TestJobCancelAndErrors: DELETE cancels a running job and answers it;
// unknown jobs, bad paths and methods, and states that cannot be replayed
// in bulk are refused.
func TestJobCancelAndErrors(t *testing.T) {
	state := NewState()
	b := &fakeBackend{ready: true, st: parkedStore(2), hold: make(chan struct{})}
	api := newTestAPI(b, state)
	_, body := serve(t, api, http.MethodPost, "/pingback/replays", "")
	var j adminapi.ReplayJobState
	if err := json.Unmarshal([]byte(body), &j); err != nil || j.Matched != 2 {
		t.Fatalf("POST with no body (state parked): %s", body)
	}
	if code, _ := serve(t, api, http.MethodDelete, "/pingback/replays/"+j.ID, ""); code != http.StatusOK {
		t.Fatalf("DELETE: %d", code)
	}
	testkit.WaitFor(t, 5*time.Second, "the job cancelled", func() bool {
		_, j = jobOf(t, api, j.ID)
		return j.Status == "cancelled"
	})
	for _, tc := range []struct {
		method, target, body string
		want                 int
		msg                  string
	}{
		{http.MethodGet, "/pingback/replays/0123456789abcdef", "", http.StatusNotFound, "bulk replay 0123456789abcdef: " + errNoJob.Error()},
		{http.MethodGet, "/pingback/replays/", "", http.StatusNotFound, "not found: use /pingback/replays/<id>"},
		{http.MethodGet, "/pingback/replays/a/b", "", http.StatusNotFound, "not found: use /pingback/replays/<id>"},
		{http.MethodPut, "/pingback/replays/" + j.ID, "", http.StatusMethodNotAllowed, "method PUT not allowed: use GET or DELETE"},
		{http.MethodGet, "/pingback/replays", "", http.StatusMethodNotAllowed, "method GET not allowed: use POST"},
		{http.MethodPost, "/pingback/replays", `{"state":"quarantined"}`, http.StatusBadRequest, "state quarantined cannot be replayed in bulk"},
		{http.MethodPost, "/pingback/replays", `{"state":"delivered"}`, http.StatusBadRequest, "state delivered cannot be replayed in bulk"},
	} {
		code, msg := serve(t, api, tc.method, tc.target, tc.body)
		if code != tc.want || !strings.HasPrefix(msg, tc.msg) {
			t.Errorf("%s %s %s: %d %q, want %d %q", tc.method, tc.target, tc.body, code, msg, tc.want, tc.msg)
		}
	}
	if code, msg := serve(t, newTestAPI(b, nil), http.MethodGet, "/pingback/replays/"+j.ID, ""); code != http.StatusNotFound {
		t.Errorf("with no State held (no app): %d %q, want 404", code, msg)
	}
}
