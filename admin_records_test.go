package pingback

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestAdminParkedVisibleAndReplayable checks what an operator relies on
// after an outage longer than the retries: parked results are listed, and a
// replay by hand delivers them through the same route once the app is back.
func TestAdminParkedVisibleAndReplayable(t *testing.T) {
	app := newAppStub(t)
	app.SetStatus(http.StatusServiceUnavailable)
	startCaddy(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))

	for _, id := range []string{"81", "82"} {
		if status, body := testkit.PostForm(t, testBase+"/cb", "id="+id+"&code=TOKEN-"+id); status != http.StatusOK || body != "OK" {
			t.Fatalf("pingback %s: got %d %q", id, status, body)
		}
	}
	testkit.WaitFor(t, 5*time.Second, "both results parked", func() bool {
		return getRecord(t, "2captcha", "81").State == store.StateParked && getRecord(t, "2captcha", "82").State == store.StateParked
	})

	status, body := adminDo(t, http.MethodGet, "/pingback/records?state=parked&provider=2captcha", "")
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
	if status, body := adminDo(t, http.MethodGet, "/pingback/records?state=delivered", ""); status != http.StatusOK || string(body) != `{"records":[]}`+"\n" {
		t.Errorf("delivered list: %d %s, want an empty page", status, body)
	}
	if status, body := adminDo(t, http.MethodGet, "/pingback/records?limit=1", ""); status != http.StatusOK || strings.Count(string(body), `"id"`) != 1 {
		t.Errorf("limit=1: %d %s, want one record", status, body)
	}

	// Still down: a replay by hand is one more attempt, and parks again.
	status, body = adminDo(t, http.MethodPost, "/pingback/records/2captcha/81/replay", "")
	var after store.Record
	if status != http.StatusOK || json.Unmarshal(body, &after) != nil || after.State != store.StateParked || after.Attempts != 3 {
		t.Fatalf("replay while down: %d %s, want 200 and parked after 3 attempts", status, body)
	}

	app.SetStatus(http.StatusOK)
	status, body = adminDo(t, http.MethodPost, "/pingback/records/2captcha/81/replay", "")
	if status != http.StatusOK || json.Unmarshal(body, &after) != nil || after.State != store.StateDelivered || after.Attempts != 4 {
		t.Fatalf("replay: %d %s, want 200 and delivered at attempt 4", status, body)
	}
	reqs := app.Requests()
	last := reqs[len(reqs)-1]
	if last.Header.Get(HeaderSource) != "replay" || last.Header.Get(HeaderAttempt) != "4" ||
		last.Header.Get(HeaderIdempotencyKey) != "2captcha:81" || last.Body != "id=81&code=TOKEN-81" {
		t.Errorf("app got %+v, want the original pingback as replay attempt 4", last)
	}
	if n := app.Count("2captcha:81"); n != 4 {
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
		wantAdminError(t, tc.method, tc.path, tc.status)
	}
}

// TestAdminReplayRefusedInFlight checks that a result whose forward is
// under way is not replayed by hand a second time at once.
func TestAdminReplayRefusedInFlight(t *testing.T) {
	app := newAppStub(t)
	release := make(chan struct{})
	app.Tune(func() { app.Release = release })
	defer close(release)
	startCaddy(t, "", pingbackSite("2captcha", "ack_timeout 100ms", app))

	if status, body := testkit.PostForm(t, testBase+"/cb", "id=91&code=T"); status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback: %d %q", status, body)
	}
	testkit.WaitFor(t, 5*time.Second, "the app to hold the forward", func() bool { return app.Count("2captcha:91") == 1 })
	if status, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/91/replay", ""); status != http.StatusConflict {
		t.Errorf("replay in flight: %d %s, want 409", status, body)
	}
}

// TestAdminGetRecordAndTask checks GET of one record and of one task
// (with result_at once its result arrived), good and bad input.
func TestAdminGetRecordAndTask(t *testing.T) {
	startAdminCaddy(t)
	status, answer := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{
		"provider": "2captcha", "id": "73000000001", "pingback_url": trkCallbackURL,
	}))
	if status != http.StatusCreated {
		t.Fatalf("register: %d %s", status, answer)
	}
	var task store.Task
	status, body := adminDo(t, http.MethodGet, "/pingback/tasks/2captcha/73000000001", "")
	if status != http.StatusOK || json.Unmarshal(body, &task) != nil || task.State != store.TaskPending || !task.ResultAt.IsZero() {
		t.Fatalf("task before its result: %d %s, want 200, pending, no result_at", status, body)
	}
	if strings.Contains(string(body), "result_at") {
		t.Errorf("task JSON before its result carries result_at: %s", body)
	}
	if status, answer := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{
		"provider": "2captcha", "id": "73000000002", "pingback_url": trkCallbackURL,
	})); status != http.StatusCreated {
		t.Fatalf("register: %d %s", status, answer)
	}
	before := time.Now()
	if status, body := testkit.PostForm(t, testBase+"/cb", "id=73000000001&code=TOKEN"); status != http.StatusOK {
		t.Fatalf("pingback: %d %s", status, body)
	}
	status, body = adminDo(t, http.MethodGet, "/pingback/tasks/2captcha/73000000001", "")
	if status != http.StatusOK || json.Unmarshal(body, &task) != nil || task.State != store.TaskDone {
		t.Fatalf("task after its result: %d %s, want 200 and done", status, body)
	}
	rec := getRecord(t, "2captcha", "73000000001")
	if !task.ResultAt.Equal(rec.ReceivedAt) || task.ResultAt.Before(before.Add(-time.Second)) {
		t.Errorf("result_at %s, want the result's received_at %s", task.ResultAt, rec.ReceivedAt)
	}
	var got store.Record
	status, body = adminDo(t, http.MethodGet, "/pingback/records/2captcha/73000000001", "")
	if status != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Code != "TOKEN" || got.Key() != rec.Key() {
		t.Errorf("GET record: %d %s, want 200 and the record", status, body)
	}

	// The task list, by state.
	var list struct {
		Tasks []store.Task `json:"tasks"`
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{"73000000001", "73000000002"}},
		{"?state=done", []string{"73000000001"}},
		{"?state=pending&provider=2captcha", []string{"73000000002"}},
		{"?state=expired", nil},
		{"?limit=1", []string{"73000000001"}},
	} {
		status, body := adminDo(t, http.MethodGet, "/pingback/tasks"+tc.query, "")
		if status != http.StatusOK || json.Unmarshal(body, &list) != nil {
			t.Fatalf("GET /pingback/tasks%s: %d %s", tc.query, status, body)
		}
		var ids []string
		for _, tk := range list.Tasks {
			ids = append(ids, tk.ID)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("GET /pingback/tasks%s = %v, want %v", tc.query, ids, tc.want)
		}
	}

	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/pingback/tasks?state=stopped", http.StatusBadRequest},
		{http.MethodGet, "/pingback/tasks?provider=deathbycaptcha", http.StatusBadRequest},
		{http.MethodGet, "/pingback/tasks?limit=100000", http.StatusBadRequest},
		{http.MethodGet, "/pingback/records/2captcha/404", http.StatusNotFound},
		{http.MethodGet, "/pingback/records/2captcha/", http.StatusNotFound},
		{http.MethodGet, "/pingback/records/2captcha/1/2/3", http.StatusNotFound},
		{http.MethodDelete, "/pingback/records/2captcha/73000000001/replay", http.StatusMethodNotAllowed},
		{http.MethodPost, "/pingback/records/2captcha/73000000001/replay?force=maybe", http.StatusBadRequest},
		{http.MethodGet, "/pingback/tasks/2captcha/404", http.StatusNotFound},
		{http.MethodGet, "/pingback/tasks/2captcha", http.StatusNotFound},
		{http.MethodGet, "/pingback/tasks//1", http.StatusNotFound},
		{http.MethodPost, "/pingback/tasks/2captcha/73000000001", http.StatusMethodNotAllowed},
	} {
		wantAdminError(t, tc.method, tc.path, tc.status)
	}
}

// TestAdminReplayDeliveredNeedsForce checks that a replay by hand of a
// delivered result is refused with 409 (nothing forwarded, nothing
// changed) unless force=true.
func TestAdminReplayDeliveredNeedsForce(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	if status, body := testkit.PostForm(t, testBase+"/cb", "id=95&code=T"); status != http.StatusOK {
		t.Fatalf("pingback: %d %s", status, body)
	}
	waitForState(t, 5*time.Second, "2captcha", "95", store.StateDelivered)
	before := getRecord(t, "2captcha", "95")
	for _, path := range []string{"/pingback/records/2captcha/95/replay", "/pingback/records/2captcha/95/replay?force=false"} {
		status, body := adminDo(t, http.MethodPost, path, "")
		if status != http.StatusConflict || !strings.Contains(string(body), "force=true") {
			t.Errorf("POST %s: %d %s, want 409 naming force=true", path, status, body)
		}
	}
	if after := getRecord(t, "2captcha", "95"); after.Attempts != before.Attempts || after.State != store.StateDelivered || app.Count("2captcha:95") != 1 {
		t.Errorf("refused replay changed the record (%+v) or forwarded (%d)", after.Delivery, app.Count("2captcha:95"))
	}
	status, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/95/replay?force=true", "")
	var rec store.Record
	if status != http.StatusOK || json.Unmarshal(body, &rec) != nil || rec.State != store.StateDelivered || rec.Attempts != before.Attempts+1 {
		t.Fatalf("forced replay: %d %s, want 200, delivered again at the next attempt", status, body)
	}
	if n := app.Count("2captcha:95"); n != 2 {
		t.Errorf("app saw 2captcha:95 %d times, want 2", n)
	}
}

// listPages pages through GET /pingback/records with q (limit set) and
// returns the keys in the order given; every page but the last is full.
func listPages(t *testing.T, q url.Values) []string {
	t.Helper()
	var keys []string
	for pages := 0; ; pages++ {
		if pages > 200 {
			t.Fatalf("%v: more than 200 pages", q)
		}
		status, body := adminDo(t, http.MethodGet, "/pingback/records?"+q.Encode(), "")
		var page adminapi.RecordsPage
		if status != http.StatusOK || json.Unmarshal(body, &page) != nil {
			t.Fatalf("list %v: %d %s", q, status, body)
		}
		for _, r := range page.Records {
			keys = append(keys, r.Key().String())
		}
		if page.NextCursor == "" {
			if strings.Contains(string(body), "next_cursor") {
				t.Fatalf("last page carries next_cursor: %s", body)
			}
			return keys
		}
		if q.Get("limit") != fmt.Sprint(len(page.Records)) {
			t.Fatalf("list %v: a page of %d with a next_cursor", q, len(page.Records))
		}
		q.Set("cursor", page.NextCursor)
	}
}

// TestAdminListRecordsPages stores 240 results of two providers in four
// states, received over two minutes, and pages through them with each
// filter, alone and together: every page is in received-time order, then
// key, and the pages together are exactly what the filter matches.
func TestAdminListRecordsPages(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "", app))
	st := runningApp(t).store(time.Second)
	t0 := time.Now().UTC().Truncate(time.Second).Add(-time.Hour)
	states := []store.State{store.StateDelivered, store.StateParked, store.StateRejected, store.StateFailed}
	var all []*store.Record
	for i := range 240 {
		rec := storedCallback(t, fmt.Sprintf("%04d", 7000+(i*37)%240), states[i%len(states)], 1, t0.Add(time.Hour))
		if i%3 == 0 {
			rec.Provider = "2captcha"
		}
		rec.ReceivedAt = t0.Add(time.Duration(i/2) * time.Second) // two a second: ties broken by key
		rec.ExpiresAt = t0.Add(24 * time.Hour)
		if res, err := st.Insert(context.Background(), rec); err != nil || res.Existing != nil {
			t.Fatalf("insert %s: %v %v", rec.Key(), res, err)
		}
		all = append(all, rec)
	}
	slices.SortFunc(all, func(a, b *store.Record) int { return store.ComparePosition(store.PositionOf(a), store.PositionOf(b)) })
	after, before := t0.Add(30*time.Second), t0.Add(90*time.Second)
	rfc := func(tm time.Time) string { return tm.Format(time.RFC3339) }
	for _, tc := range []struct {
		name  string
		query string
		keep  func(r *store.Record) bool
	}{
		{"all", "", func(*store.Record) bool { return true }},
		{"provider", "provider=2captcha", func(r *store.Record) bool { return r.Provider == "2captcha" }},
		{"state", "state=parked", func(r *store.Record) bool { return r.State == store.StateParked }},
		{"received_after", "received_after=" + rfc(after), func(r *store.Record) bool { return r.ReceivedAt.After(after) }},
		{"received_before", "received_before=" + rfc(before), func(r *store.Record) bool { return r.ReceivedAt.Before(before) }},
		{"all filters", "provider=captchaai&state=delivered&received_after=" + rfc(after) + "&received_before=" + rfc(before),
			func(r *store.Record) bool {
				return r.Provider == "captchaai" && r.State == store.StateDelivered && r.ReceivedAt.After(after) && r.ReceivedAt.Before(before)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []string
			for _, r := range all {
				if tc.keep(r) {
					want = append(want, r.Key().String())
				}
			}
			if len(want) < 8 {
				t.Fatalf("the filter keeps %d: not more than a page", len(want))
			}
			q, err := url.ParseQuery(tc.query)
			if err != nil {
				t.Fatal(err)
			}
			q.Set("limit", "7")
			if got := listPages(t, q); !slices.Equal(got, want) {
				t.Errorf("pages of %q:\n got %v\nwant %v", tc.query, got, want)
			}
		})
	}

	cursor := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	for _, tc := range []struct {
		method, path string
		status       int
		reason       string
	}{
		{http.MethodGet, "/pingback/records?cursor=%21%21", http.StatusBadRequest, "cursor"},
		{http.MethodGet, "/pingback/records?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("not json")), http.StatusBadRequest, "cursor"},
		{http.MethodGet, "/pingback/records?cursor=" + cursor([]any{1, "captchaai"}), http.StatusBadRequest, "cursor"},
		{http.MethodGet, "/pingback/records?cursor=" + cursor([]any{"x", "captchaai", "1"}), http.StatusBadRequest, "cursor"},
		{http.MethodGet, "/pingback/records?cursor=" + cursor([]any{-1, "captchaai", "1"}), http.StatusBadRequest, "cursor"},
		{http.MethodGet, "/pingback/records?received_after=yesterday", http.StatusBadRequest, "received_after"},
		{http.MethodGet, "/pingback/records?received_before=2026-13-01T00:00:00Z", http.StatusBadRequest, "received_before"},
		{http.MethodGet, "/pingback/records?limit=10001", http.StatusBadRequest, "limit"},
		{http.MethodGet, "/pingback/records?limit=x", http.StatusBadRequest, "limit"},
		{http.MethodGet, "/pingback/records?state=lost", http.StatusBadRequest, "unknown state"},
		{http.MethodGet, "/pingback/records?provider=deathbycaptcha", http.StatusBadRequest, "deathbycaptcha"},
		{http.MethodDelete, "/pingback/records", http.StatusMethodNotAllowed, "GET"},
		{http.MethodGet, "/pingback/tasks?cursor=abc", http.StatusBadRequest, "cursor"},
		{http.MethodGet, "/pingback/tasks?cursor=" + cursor([]string{"captchaai"}), http.StatusBadRequest, "cursor"},
		// A cursor of the task order before (by provider and id).
		{http.MethodGet, "/pingback/tasks?cursor=" + cursor([]string{"captchaai", "100"}), http.StatusBadRequest, "cursor"},
		{http.MethodGet, "/pingback/tasks?limit=0", http.StatusBadRequest, "limit"},
	} {
		status, body := adminDo(t, tc.method, tc.path, "")
		var e struct {
			Error string `json:"error"`
		}
		if status != tc.status || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error, tc.reason) {
			t.Errorf("%s %s: %d %s, want %d with an error about %q", tc.method, tc.path, status, body, tc.status, tc.reason)
		}
	}

	// A cursor from the first page of one query, on a page of 1.
	status, body := adminDo(t, http.MethodGet, "/pingback/records?limit=1", "")
	var first adminapi.RecordsPage
	if status != http.StatusOK || json.Unmarshal(body, &first) != nil || first.NextCursor == "" || len(first.Records) != 1 ||
		first.Records[0].Key().String() != all[0].Key().String() {
		t.Fatalf("first page of one: %d %s, want %s and a next_cursor", status, body, all[0].Key())
	}
	status, body = adminDo(t, http.MethodGet, "/pingback/records?limit=1&cursor="+first.NextCursor, "")
	var second adminapi.RecordsPage
	if status != http.StatusOK || json.Unmarshal(body, &second) != nil || len(second.Records) != 1 || second.Records[0].Key().String() != all[1].Key().String() {
		t.Errorf("second page of one: %d %s, want %s", status, body, all[1].Key())
	}
}

// wantAdminError sends method path (no body) to the admin API and fails t
// unless the answer has status and a JSON error.
func wantAdminError(t *testing.T, method, path string, status int) {
	t.Helper()
	if got, body := adminDo(t, method, path, ""); got != status || !strings.Contains(string(body), `"error"`) {
		t.Errorf("%s %s: %d %s, want %d with an error", method, path, got, body, status)
	}
}
