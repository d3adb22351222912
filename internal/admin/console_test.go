package admin

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestConsoleToken: a token is valid for every console of the process
// within its life and a minute of clock skew; an expired, future,
// forged, truncated or missing one is refused with what to do.
func TestConsoleToken(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *Console {
		return NewConsole(nil, nil, ConsoleOptions{Now: func() time.Time { return now.Add(d) }})
	}
	tok := at(0).NewToken()
	parts := strings.Split(tok, ".")
	for _, tc := range []struct {
		name  string
		check *Console
		tok   string
		want  string
	}{
		{"fresh, another console", at(0), tok, ""},
		{"at the end of its life", at(ConsoleTokenLife), tok, ""},
		{"expired", at(ConsoleTokenLife + time.Second), tok, "console token expired: reload the console page"},
		{"a minute ahead", at(-time.Minute), tok, ""},
		{"from the future", at(-time.Minute - time.Second), tok, "console token expired: reload the console page"},
		{"forged", at(0), parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2])), "invalid console token: reload the console page"},
		{"re-dated", at(0), parts[0] + ".1" + parts[1] + "." + parts[2], "invalid console token: reload the console page"},
		{"truncated", at(0), parts[0] + "." + parts[1], "invalid console token: reload the console page"},
		{"missing", at(0), "", "missing X-Pingback-Console-Token header: reload the console page"},
	} {
		err := tc.check.checkToken(tc.tok)
		if (tc.want == "" && err != nil) || (tc.want != "" && (err == nil || err.Error() != tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestConsoleAnswersOnlyForTheRunningApp: the console of an app that is
// not the running one (starting or stopping in a reload) answers its API
// 503 and asks to try again; the running one's API reaches the admin
// routes, with a started job's Location under the console's mount.
func TestConsoleAnswersOnlyForTheRunningApp(t *testing.T) {
	running := &fakeBackend{ready: true, st: parkedStore(1)}
	api := newTestAPI(running, NewState())
	other := NewConsole(&fakeBackend{ready: true}, api, ConsoleOptions{})
	mounted := func(r *http.Request) *http.Request { // handle_path /ops/*
		o := r.Clone(context.Background())
		o.URL.Path = "/ops" + r.URL.Path
		return o
	}
	mine := NewConsole(running, api, ConsoleOptions{Original: mounted})
	call := func(c *Console) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "http://localhost/api/replays", strings.NewReader(`{}`))
		r.Header.Set(ConsoleTokenHeader, c.NewToken())
		r.Header.Set("Origin", "http://localhost")
		w := httptest.NewRecorder()
		if err := c.ServeHTTP(w, r); err != nil {
			t.Fatal(err)
		}
		return w
	}
	if w := call(other); w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "the config is being reloaded: try again") {
		t.Errorf("the console of another app: %d %s, want 503 being reloaded", w.Code, w.Body)
	}
	w := call(mine)
	if w.Code != http.StatusAccepted || !strings.HasPrefix(w.Header().Get("Location"), "/ops/api/replays/") || w.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("the running app's console: %d %v %s, want 202 with Location /ops/api/replays/<id>", w.Code, w.Header(), w.Body)
	}
}

// TestConsolePageErrors: what the page's paths refuse, as caddy.APIErrors
// the root turns into its server's errors.
func TestConsolePageErrors(t *testing.T) {
	c := NewConsole(nil, nil, ConsoleOptions{})
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/index.html", http.StatusNotFound},
		{http.MethodGet, "/console.txt", http.StatusNotFound},
	} {
		err := c.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(tc.method, "http://localhost"+tc.path, nil))
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) || apiErr.HTTPStatus != tc.want {
			t.Errorf("%s %s: %v, want an APIError of status %d", tc.method, tc.path, err, tc.want)
		}
	}
}
