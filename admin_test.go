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

// adminTasksURL is the task registration endpoint of the test admin.
var adminTasksURL = "http://" + testAdmin + "/pingback/tasks"

// adminCall sends a request to the task registration endpoint and returns
// the status and the body.
func adminCall(t *testing.T, method, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, adminTasksURL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	// No keep-alive: each config load may replace the admin server.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, adminTasksURL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
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
	status, answer := adminCall(t, http.MethodPost, body)
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
		status, answer := adminCall(t, http.MethodPost, again)
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
		status, answer := adminCall(t, http.MethodPost, adminRegistration(t, map[string]string{
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
			status, answer := adminCall(t, http.MethodPost, tc.body)
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
		if status, answer := adminCall(t, method, body); status != http.StatusMethodNotAllowed {
			t.Errorf("%s: got %d %s, want 405", method, status, answer)
		}
	}
	trkAssertNoTask(t, "72000000020")
}
