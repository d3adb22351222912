package cli

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestFlagTime reads RFC 3339 times as they are and durations as a time
// ago, and names the flag in its error.
func TestFlagTime(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "", want: ""},
		{in: "2026-01-02T03:04:05Z", want: "2026-01-02T03:04:05Z"},
		{in: "2026-01-02T03:04:05+02:00", want: "2026-01-02T03:04:05+02:00"},
		{in: "yesterday", err: `--since must be an RFC 3339 time or a duration, got "yesterday"`},
		{in: "2026-01-02", err: "--since must be"},
	} {
		got, err := flagTime("since", tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("flagTime(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("flagTime(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	before := time.Now().Add(-2 * time.Hour).Truncate(time.Second)
	got, err := flagTime("since", "2h")
	if err != nil {
		t.Fatal(err)
	}
	at, err := time.Parse(time.RFC3339, got)
	if err != nil || at.Before(before) || at.After(before.Add(time.Minute)) {
		t.Errorf("flagTime(2h) = %q (%v), want about %s", got, err, before.UTC().Format(time.RFC3339))
	}
}

// TestProgressBar draws 40 columns whatever the counts.
func TestProgressBar(t *testing.T) {
	for _, tc := range []struct {
		done, matched int
		want          string
	}{
		{0, 0, "[########################################] 0/0"},
		{0, 10, "[........................................] 0/10"},
		{5, 10, "[####################....................] 5/10"},
		{10, 10, "[########################################] 10/10"},
	} {
		got := progressBar(adminapi.ReplayJobState{Done: tc.done, Matched: tc.matched})
		if !strings.HasPrefix(got, tc.want+", ") {
			t.Errorf("progressBar(%d/%d) = %q, want %q...", tc.done, tc.matched, got, tc.want)
		}
	}
}

// TestUntil counts a time to come as "in ..." and a time past as ago.
func TestUntil(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 39, 2, 0, time.UTC)
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{now.Add(3 * time.Second), "in 3s"},
		{now.Add(2600 * time.Millisecond), "in 3s"},
		{now.Add(90 * time.Second), "in 1m30s"},
		{now, "0s ago"},
		{now.Add(-2 * time.Second), "2s ago"},
	} {
		if got := until(tc.at, now); got != tc.want {
			t.Errorf("until(now%+v) = %q, want %q", tc.at.Sub(now), got, tc.want)
		}
	}
}

// TestWriteStatus checks `caddy pingback status` on StatusAnswer values:
// the routes held back are listed by route, with when their replays
// resume (a time and "in 3s", "-" when not paused) and their replay
// concurrency "n of max"; with none, nothing is added.
func TestWriteStatus(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 39, 2, 0, time.UTC)
	paused := now.Add(3 * time.Second)
	over := now.Add(-time.Second)
	base := func(routes map[string]adminapi.RouteStatus) adminapi.StatusAnswer {
		return adminapi.StatusAnswer{
			Records:        map[string]map[store.State]int64{"2captcha": {store.StateDelivered: 3, store.StateFailed: 1}},
			Tasks:          map[string]adminapi.TaskStatus{"2captcha": {Pending: 1, OldestPendingAgeSeconds: 3}},
			LastCallbackAt: map[string]time.Time{"2captcha": now.Add(-3 * time.Second)},
			Loops: map[string]adminapi.LoopStatus{
				"replay": {LastRunAt: now, NextRunAt: now.Add(time.Second)},
				"poll":   {LastRunAt: now.Add(-time.Second), NextRunAt: now},
			},
			Store:  adminapi.StoreStatus{Kind: "badger", Location: "/var/lib/caddy/pingback", Available: true},
			Routes: routes,
		}
	}
	const providers = `PROVIDER  STORED  DELIVERED  FAILED  REJECTED  PARKED  QUARANTINED  PENDING TASKS  UNPOLLABLE  OLDEST PENDING  LAST PINGBACK
2captcha  4       3          1       0         0       0            1              0           3s              3s ago
`
	const tail = `loop replay: last run 0s ago
loop poll: last run 1s ago
store: badger /var/lib/caddy/pingback, available
`
	for _, tc := range []struct {
		name   string
		routes map[string]adminapi.RouteStatus
		want   string
	}{
		{name: "no route held back", routes: map[string]adminapi.RouteStatus{}, want: providers + tail},
		{name: "routes absent (an older Caddy)", routes: nil, want: providers + tail},
		{name: "paused, below max, pause just over", routes: map[string]adminapi.RouteStatus{
			"app.example/cb":      {PausedUntil: &paused, Concurrency: 1, Max: 4},
			"app.example/cb/json": {Concurrency: 3, Max: 4},
			"api.example/hook":    {PausedUntil: &over, Concurrency: 2, Max: 4},
		}, want: providers + `ROUTE                PAUSED UNTIL                   REPLAY CONCURRENCY
api.example/hook     2026-12-01T15:39:01Z (1s ago)  2 of 4
app.example/cb       2026-12-01T15:39:05Z (in 3s)   1 of 4
app.example/cb/json  -                              3 of 4
` + tail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if err := writeStatus(&out, base(tc.routes), now); err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestWriteStatusAccounts checks the accounts of `caddy pingback status`:
// the unpollable tasks per provider in the provider table, and under it
// one row per account sorted by provider and account id, with its api_key
// entry (placeholder or position; "(not in api_key)" for an account
// without a configured key), its budget and its pending and unpollable
// tasks; with no account (or an older Caddy) no accounts table.
func TestWriteStatusAccounts(t *testing.T) {
	now := time.Date(2026, 12, 1, 15, 39, 2, 0, time.UTC)
	base := func(tasks map[string]adminapi.TaskStatus, accounts map[string]map[string]adminapi.AccountStatus) adminapi.StatusAnswer {
		return adminapi.StatusAnswer{
			Records:  map[string]map[store.State]int64{"2captcha": {store.StateDelivered: 2}},
			Tasks:    tasks,
			Loops:    map[string]adminapi.LoopStatus{},
			Store:    adminapi.StoreStatus{Kind: "badger", Location: "/var/lib/caddy/pingback", Available: true},
			Accounts: accounts,
		}
	}
	const tail = `loop replay: last run -
loop poll: last run -
store: badger /var/lib/caddy/pingback, available
`
	for _, tc := range []struct {
		name     string
		tasks    map[string]adminapi.TaskStatus
		accounts map[string]map[string]adminapi.AccountStatus
		want     string
	}{
		{name: "no account", accounts: map[string]map[string]adminapi.AccountStatus{},
			want: `PROVIDER  STORED  DELIVERED  FAILED  REJECTED  PARKED  QUARANTINED  PENDING TASKS  UNPOLLABLE  OLDEST PENDING  LAST PINGBACK
2captcha  2       2          0       0         0       0            0              0           -               -
` + tail},
		{name: "accounts absent (an older Caddy)", accounts: nil,
			want: `PROVIDER  STORED  DELIVERED  FAILED  REJECTED  PARKED  QUARANTINED  PENDING TASKS  UNPOLLABLE  OLDEST PENDING  LAST PINGBACK
2captcha  2       2          0       0         0       0            0              0           -               -
` + tail},
		{name: "a rotation and an unknown key",
			tasks: map[string]adminapi.TaskStatus{
				"2captcha":    {Pending: 9, Unpollable: 2},
				"anticaptcha": {Pending: 1},
			},
			accounts: map[string]map[string]adminapi.AccountStatus{
				"2captcha": {
					"f3a9c2d17b604e58": {APIKeyEntry: "{env.CAPTCHA_KEY_NEW}", Used: 3, Left: 1197, Pending: 4},
					"0c41d8e2a5b79f13": {APIKeyEntry: "{env.CAPTCHA_KEY_OLD}", Used: 120, Left: 1080, Pending: 3},
					"9e0b7a6c5d4f3e21": {Pending: 2, Unpollable: 2},
				},
				"anticaptcha": {"5a5a5a5a5a5a5a5a": {APIKeyEntry: "api_key #1", Used: 1, Left: 1199, Pending: 1}},
			},
			want: `PROVIDER     STORED  DELIVERED  FAILED  REJECTED  PARKED  QUARANTINED  PENDING TASKS  UNPOLLABLE  OLDEST PENDING  LAST PINGBACK
2captcha     2       2          0       0         0       0            9              2           -               -
anticaptcha  0       0          0       0         0       0            1              0           -               -
PROVIDER     ACCOUNT           API_KEY ENTRY          USED  LEFT  PENDING  UNPOLLABLE
2captcha     0c41d8e2a5b79f13  {env.CAPTCHA_KEY_OLD}  120   1080  3        0
2captcha     9e0b7a6c5d4f3e21  (not in api_key)       0     0     2        2
2captcha     f3a9c2d17b604e58  {env.CAPTCHA_KEY_NEW}  3     1197  4        0
anticaptcha  5a5a5a5a5a5a5a5a  api_key #1             1     1199  1        0
` + tail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			if err := writeStatus(&out, base(tc.tasks, tc.accounts), now); err != nil {
				t.Fatal(err)
			}
			if got := out.String(); got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// TestWriteTasks checks the rows of `caddy pingback tasks`: each task
// with its account id, "-" for a task without one.
func TestWriteTasks(t *testing.T) {
	at := time.Date(2026, 12, 1, 15, 39, 2, 0, time.UTC)
	tasks := []*store.Task{
		{Provider: "2captcha", ID: "7300001", Account: "0c41d8e2a5b79f13", State: store.TaskPending, SubmittedAt: at,
			Polls: 2, NextPollAt: at.Add(time.Minute)},
		{Provider: "2captcha", ID: "7300002", Account: "f3a9c2d17b604e58", State: store.TaskDone, SubmittedAt: at,
			ResultAt: at.Add(20 * time.Second)},
		{Provider: "capsolver", ID: "b1-c2", State: store.TaskExpired, SubmittedAt: at, LastError: "ERROR_KEY_DOES_NOT_EXIST"},
	}
	const want = `PROVIDER   ID       ACCOUNT           STATE    SUBMITTED             POLLS  NEXT POLL             RESULT AT             LAST ERROR
2captcha   7300001  0c41d8e2a5b79f13  pending  2026-12-01T15:39:02Z  2      2026-12-01T15:40:02Z  -                     -
2captcha   7300002  f3a9c2d17b604e58  done     2026-12-01T15:39:02Z  0      -                     2026-12-01T15:39:22Z  -
capsolver  b1-c2    -                 expired  2026-12-01T15:39:02Z  0      -                     -                     ERROR_KEY_DOES_NOT_EXIST
`
	var out strings.Builder
	if err := writeTasks(&out, tasks); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestTasksAccountFlag runs `caddy pingback tasks --account <id>` against
// an admin endpoint on loopback: the account goes to GET /pingback/tasks
// as ?account=, beside the other filters, and the answer's account is
// shown; without the flag no account= is sent.
func TestTasksAccountFlag(t *testing.T) {
	var queries []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/pingback/tasks" {
			http.NotFound(w, r)
			return
		}
		queries = append(queries, r.URL.Query())
		_, _ = io.WriteString(w, `{"tasks":[{"provider":"2captcha","id":"7300001","account":"0c41d8e2a5b79f13","state":"pending","submitted_at":"2026-12-01T15:39:02Z"}]}`)
	}))
	defer srv.Close()
	for _, tc := range []struct {
		name        string
		args        []string
		wantAccount string
		wantHas     bool
	}{
		{"with --account", []string{"--state", "pending", "--account", "0c41d8e2a5b79f13"}, "0c41d8e2a5b79f13", true},
		{"without", []string{"--state", "pending"}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queries = nil
			cmd := tasksCommand()
			var out, errOut strings.Builder
			cmd.SetOut(&out)
			cmd.SetErr(&errOut)
			cmd.SetArgs(append([]string{"--address", srv.Listener.Addr().String()}, tc.args...))
			if err := cmd.Execute(); err != nil {
				t.Fatalf("%v: %s", err, errOut.String())
			}
			if len(queries) != 1 {
				t.Fatalf("%d requests, want 1", len(queries))
			}
			q := queries[0]
			if got, has := q.Get("account"), q.Has("account"); got != tc.wantAccount || has != tc.wantHas {
				t.Errorf("account= %q (sent %v), want %q (sent %v); query %s", got, has, tc.wantAccount, tc.wantHas, q.Encode())
			}
			if q.Get("state") != "pending" {
				t.Errorf("state= %q, want pending: the other filters lost", q.Get("state"))
			}
			if !strings.Contains(out.String(), "7300001  0c41d8e2a5b79f13  pending") {
				t.Errorf("output %q does not show the task's account", out.String())
			}
		})
	}
}
