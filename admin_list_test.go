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
)

// listPages pages through GET /pingback/records with q (limit set) and
// returns the keys in the order given; every page but the last is full.
func listPages(t *testing.T, q url.Values) []string {
	t.Helper()
	var keys []string
	for pages := 0; ; pages++ {
		if pages > 200 {
			t.Fatalf("%v: more than 200 pages", q)
		}
		status, body := adminRequest(t, http.MethodGet, "/pingback/records?"+q.Encode())
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
		status, body := adminRequest(t, tc.method, tc.path)
		var e struct {
			Error string `json:"error"`
		}
		if status != tc.status || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error, tc.reason) {
			t.Errorf("%s %s: %d %s, want %d with an error about %q", tc.method, tc.path, status, body, tc.status, tc.reason)
		}
	}

	// A cursor from the first page of one query, on a page of 1.
	status, body := adminRequest(t, http.MethodGet, "/pingback/records?limit=1")
	var first adminapi.RecordsPage
	if status != http.StatusOK || json.Unmarshal(body, &first) != nil || first.NextCursor == "" || len(first.Records) != 1 ||
		first.Records[0].Key().String() != all[0].Key().String() {
		t.Fatalf("first page of one: %d %s, want %s and a next_cursor", status, body, all[0].Key())
	}
	status, body = adminRequest(t, http.MethodGet, "/pingback/records?limit=1&cursor="+first.NextCursor)
	var second adminapi.RecordsPage
	if status != http.StatusOK || json.Unmarshal(body, &second) != nil || len(second.Records) != 1 || second.Records[0].Key().String() != all[1].Key().String() {
		t.Errorf("second page of one: %d %s, want %s", status, body, all[1].Key())
	}
}

// TestAdminListTasksPages pages through GET /pingback/tasks with each
// filter: submission time (submitted_at), then provider, then id.
func TestAdminListTasksPages(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "", app))
	st := runningApp(t).store(time.Second)
	now := time.Now().UTC().Truncate(time.Second)
	var tasks []*store.Task
	for i := range 40 {
		// Submitted later as the ids fall, two a second, two providers:
		// neither the key order nor the insertion order is the answer.
		tk := &store.Task{Provider: "captchaai", ID: fmt.Sprintf("%03d", 200-i), SubmittedAt: now.Add(time.Duration(i/2) * time.Second),
			PingbackURL: testBase + "/cb", State: store.TaskPending, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if i%3 == 0 {
			tk.Provider = "2captcha"
		}
		switch i % 5 {
		case 0:
			tk.State = store.TaskExpired
		case 1:
			tk.State = store.TaskDone
		}
		if _, err := st.AddTask(context.Background(), tk); err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, tk)
	}
	slices.SortFunc(tasks, func(a, b *store.Task) int {
		return store.CompareTaskPosition(store.TaskPositionOf(a), store.TaskPositionOf(b))
	})
	want := func(provider string, state store.TaskState) []string {
		var out []string
		for _, tk := range tasks {
			if (provider == "" || tk.Provider == provider) && (state == "" || tk.State == state) {
				out = append(out, tk.Key().String())
			}
		}
		return out
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"limit=4", want("", "")},
		{"limit=40", want("", "")},
		{"limit=3&provider=2captcha", want("2captcha", "")},
		{"limit=6&state=pending", want("", store.TaskPending)},
		{"limit=2&state=done", want("", store.TaskDone)},
		{"limit=5&state=expired", want("", store.TaskExpired)},
		{"limit=2&state=pending&provider=captchaai", want("captchaai", store.TaskPending)},
	} {
		q, _ := url.ParseQuery(tc.query)
		var got []string
		for pages := 0; pages < 50; pages++ {
			status, body := adminRequest(t, http.MethodGet, "/pingback/tasks?"+q.Encode())
			var page adminapi.TasksPage
			if status != http.StatusOK || json.Unmarshal(body, &page) != nil {
				t.Fatalf("tasks %s: %d %s", tc.query, status, body)
			}
			for _, tk := range page.Tasks {
				got = append(got, tk.Key().String())
			}
			if page.NextCursor == "" {
				break
			}
			q.Set("cursor", page.NextCursor)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("tasks pages of %q: got %v, want %v", tc.query, got, tc.want)
		}
	}
}
