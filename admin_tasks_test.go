package pingback

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

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
			status, body := adminDo(t, http.MethodGet, "/pingback/tasks?"+q.Encode(), "")
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

// adminRegistration is a registration body; empty fields are left out.
func adminRegistration(t *testing.T, fields map[string]string) string {
	t.Helper()
	b, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// startAdminCaddy starts a config with a pingback route on /cb, so that
// trkCallbackURL is a URL this Caddy serves, and a fixed poll after.
func startAdminCaddy(t *testing.T) {
	t.Helper()
	app := newAppStub(t)
	startCaddy(t, trkGlobal, pingbackSite("2captcha", "", app))
}

// TestAdminRegisterTask checks that a registered task is stored pending,
// its first poll due `after` past its submission, that registering it
// again answers 200 with the stored task unchanged, and that submitted_at
// defaults to now.
func TestAdminRegisterTask(t *testing.T) {
	startAdminCaddy(t)

	submitted := time.Now().Add(-10 * time.Second).UTC().Truncate(time.Second)
	body := adminRegistration(t, map[string]string{
		"provider":     "2captcha",
		"id":           "72000000001",
		"pingback_url": trkCallbackURL,
		"method":       "userrecaptcha",
		"submitted_at": submitted.Format(time.RFC3339),
	})
	status, answer := adminDo(t, http.MethodPost, "/pingback/tasks", body)
	if status != http.StatusCreated {
		t.Fatalf("got %d %s, want 201", status, answer)
	}
	var got store.Task
	if err := json.Unmarshal(answer, &got); err != nil {
		t.Fatalf("answer %s: %v", answer, err)
	}
	task, err := trkTask(t, "72000000001")
	if err != nil {
		t.Fatalf("task not stored: %v", err)
	}
	if task.Provider != "2captcha" || task.Method != "userrecaptcha" || task.PingbackURL != trkCallbackURL ||
		task.State != store.TaskPending || !task.SubmittedAt.Equal(submitted) {
		t.Errorf("stored %+v, want 2captcha, userrecaptcha, %s, pending, submitted %s", task, trkCallbackURL, submitted)
	}
	if want := submitted.Add(trkAfter); !task.NextPollAt.Equal(want) {
		t.Errorf("next_poll_at %s, want submitted_at + %s = %s", task.NextPollAt, trkAfter, want)
	}
	if got.ID != task.ID || got.State != task.State || !got.NextPollAt.Equal(task.NextPollAt) {
		t.Errorf("answered %+v, want the stored task %+v", got, task)
	}

	t.Run("again", func(t *testing.T) {
		again := adminRegistration(t, map[string]string{
			"provider":     "2captcha",
			"id":           "72000000001",
			"pingback_url": trkCallbackURL,
			"method":       "post",
		})
		status, answer := adminDo(t, http.MethodPost, "/pingback/tasks", again)
		if status != http.StatusOK {
			t.Fatalf("got %d %s, want 200", status, answer)
		}
		var got store.Task
		if err := json.Unmarshal(answer, &got); err != nil {
			t.Fatalf("answer %s: %v", answer, err)
		}
		if got.Method != "userrecaptcha" || !got.SubmittedAt.Equal(submitted) {
			t.Errorf("answered %+v, want the task as first registered", got)
		}
		if now, err := trkTask(t, "72000000001"); err != nil || now.Method != "userrecaptcha" || !now.NextPollAt.Equal(task.NextPollAt) {
			t.Errorf("stored task after a second registration: %+v, %v; want it unchanged", now, err)
		}
	})

	t.Run("submitted_at defaults to now", func(t *testing.T) {
		before := time.Now()
		status, answer := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{
			"provider":     "2captcha",
			"id":           "72000000002",
			"pingback_url": trkCallbackURL,
		}))
		if status != http.StatusCreated {
			t.Fatalf("got %d %s, want 201", status, answer)
		}
		trkAssertPending(t, "72000000002", "", trkCallbackURL, before, time.Now())
	})
}

// TestAdminRegisterTaskRejects checks that bad registrations are refused
// with 400 and a reason that says what is wrong, and store nothing.
func TestAdminRegisterTaskRejects(t *testing.T) {
	startAdminCaddy(t)

	valid := func(change map[string]string) string {
		f := map[string]string{"provider": "2captcha", "id": "72000000010", "pingback_url": trkCallbackURL}
		for k, v := range change {
			if v == "" {
				delete(f, k)
			} else {
				f[k] = v
			}
		}
		return adminRegistration(t, f)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	tests := []struct {
		name, body, reason string
	}{
		{"bad JSON", `{"provider": "2captcha", "id": `, "decoding JSON"},
		{"not an object", `["2captcha", "72000000010"]`, "decoding JSON"},
		{"empty body", ``, "decoding JSON"},
		{"unknown field", `{"provider":"2captcha","id":"72000000010","pingback_url":"` + trkCallbackURL + `","callback":"x"}`, `unknown field "callback"`},
		{"wrong type", `{"provider":"2captcha","id":72000000010,"pingback_url":"` + trkCallbackURL + `"}`, "decoding JSON"},
		{"missing provider", valid(map[string]string{"provider": ""}), "provider is required"},
		{"unknown provider", valid(map[string]string{"provider": "deathbycaptcha"}), `unknown provider "deathbycaptcha"`},
		{"missing id", valid(map[string]string{"id": ""}), "id is required"},
		{"malformed id", valid(map[string]string{"id": "72ab"}), `malformed task id "72ab"`},
		{"id too long", valid(map[string]string{"id": strings.Repeat("7", 33)}), "malformed task id"},
		{"missing pingback_url", valid(map[string]string{"pingback_url": ""}), "pingback_url is required"},
		{"relative pingback_url", valid(map[string]string{"pingback_url": "/cb"}), "not an absolute http(s) URL"},
		{"ftp pingback_url", valid(map[string]string{"pingback_url": "ftp://localhost/cb"}), "not an absolute http(s) URL"},
		{"pingback_url on a port not served here, a path no site serves", valid(map[string]string{"pingback_url": "http://localhost:1/nowhere"}), "no pingback handler serves POST http://localhost:1/nowhere"},
		{"pingback_url without a pingback handler", valid(map[string]string{"pingback_url": strings.Replace(trkCallbackURL, "/cb", "/not-a-pingback-route", 1)}), "no pingback handler serves POST"},
		{"pingback_url of another host", valid(map[string]string{"pingback_url": strings.Replace(trkCallbackURL, "localhost", "elsewhere.example", 1)}), "no pingback handler serves"},
		{"submitted_at in the future", valid(map[string]string{"submitted_at": future}), "is in the future"},
		{"submitted_at malformed", valid(map[string]string{"submitted_at": "yesterday"}), "submitted_at must be an RFC 3339 time"},
		{"submitted_at without zone", valid(map[string]string{"submitted_at": "2026-11-29T22:00:00"}), "submitted_at must be an RFC 3339 time"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, answer := adminDo(t, http.MethodPost, "/pingback/tasks", tc.body)
			var e struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(answer, &e); err != nil {
				t.Fatalf("got %d %q, want a JSON error", status, answer)
			}
			if status != http.StatusBadRequest || !strings.Contains(e.Error, tc.reason) {
				t.Errorf("got %d %q, want 400 with a reason containing %q", status, e.Error, tc.reason)
			}
		})
	}
	if tasks := trkPending(t); len(tasks) != 0 {
		t.Errorf("%d tasks stored by rejected registrations, want none; first: %+v", len(tasks), tasks[0])
	}
	trkAssertNoTask(t, "72000000010")
}

// TestAdminRegisterTaskMethods checks that only POST registers a task.
func TestAdminRegisterTaskMethods(t *testing.T) {
	startAdminCaddy(t)
	body := adminRegistration(t, map[string]string{"provider": "2captcha", "id": "72000000020", "pingback_url": trkCallbackURL})
	for _, method := range []string{http.MethodPut, http.MethodDelete, http.MethodPatch} {
		if status, answer := adminDo(t, method, "/pingback/tasks", body); status != http.StatusMethodNotAllowed {
			t.Errorf("%s: got %d %s, want 405", method, status, answer)
		}
	}
	trkAssertNoTask(t, "72000000020")
}

// TestRegisterUnpollableTask: registering a task for a provider the
// plugin cannot poll (no api_key, or an API family it lacks) answers 400
// with the reason; today's main stored it and failed at the first poll.
func TestRegisterUnpollableTask(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, trkGlobal, pingbackSite("2captcha", "", app))
	for _, tc := range []struct {
		fields map[string]string
		want   string
	}{
		{map[string]string{"provider": "rucaptcha", "id": "71000000301", "pingback_url": trkCallbackURL}, "no api_key configured"},
		{map[string]string{"provider": "captchaai", "id": "71000000302", "pingback_url": trkCallbackURL, "api": "json"}, "no json API"},
		{map[string]string{"provider": "2captcha", "id": "71000000303", "pingback_url": trkCallbackURL, "api": "soap"}, "api must be legacy or json"},
	} {
		status, body := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, tc.fields))
		if status != http.StatusBadRequest || !strings.Contains(string(body), tc.want) {
			t.Errorf("%v: got %d %s, want 400 saying %q", tc.fields, status, body, tc.want)
		}
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
		status, body := adminDo(t, http.MethodPost, "/pingback/tasks", adminRegistration(t, map[string]string{
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
