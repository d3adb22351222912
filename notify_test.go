package pingback

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"

	"github.com/caddy-pingback/pingback/internal/notify"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestNotifyCaddyfile parses notify and failing_after in the global
// option into the app's JSON notify object.
func TestNotifyCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		want        NotifyConfig
	}{
		{"all", "pingback {\n\tnotify https://hooks.example/pb {\n\t\tsecret {env.PB_SECRET}\n\t\tinterval 1m\n\t}\n\tfailing_after 30m\n}",
			NotifyConfig{URL: "https://hooks.example/pb", Secret: "{env.PB_SECRET}", Interval: caddy.Duration(time.Minute), FailingAfter: caddy.Duration(30 * time.Minute)}},
		{"failing_after alone", "pingback {\n\tfailing_after 2m\n}",
			NotifyConfig{FailingAfter: caddy.Duration(2 * time.Minute)}},
		{"failing_after first", "pingback {\n\tfailing_after 2m\n\tnotify http://127.0.0.1:9/x {\n\t\tsecret s\n\t}\n}",
			NotifyConfig{URL: "http://127.0.0.1:9/x", Secret: "s", FailingAfter: caddy.Duration(2 * time.Minute)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := parseGlobalOption(caddyfile.NewTestDispenser(tc.input), nil)
			if err != nil {
				t.Fatal(err)
			}
			var app App
			if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &app); err != nil {
				t.Fatal(err)
			}
			if app.Notify == nil || *app.Notify != tc.want {
				t.Errorf("notify %+v, want %+v", app.Notify, tc.want)
			}
		})
	}
}

// TestNotifyCaddyfileErrors: mistakes in notify are parse errors naming
// the line.
func TestNotifyCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		want        []string
	}{
		{"no url", "pingback {\n\tnotify {\n\t\tsecret s\n\t}\n}", []string{"notify takes the URL to POST events to", "Testfile:2"}},
		{"two urls", "pingback {\n\tnotify http://a/ http://b/\n}", []string{"wrong argument count", "Testfile:2"}},
		{"unknown option", "pingback {\n\tnotify http://a/ {\n\t\ttoken s\n\t}\n}", []string{"unrecognized notify option 'token'", "Testfile:3"}},
		{"repeated secret", "pingback {\n\tnotify http://a/ {\n\t\tsecret s\n\t\tsecret t\n\t}\n}", []string{"notify secret specified more than once", "Testfile:4"}},
		{"bad interval", "pingback {\n\tnotify http://a/ {\n\t\tinterval often\n\t}\n}", []string{"invalid interval 'often'", "Testfile:3"}},
		{"bad failing_after", "pingback {\n\tfailing_after soon\n}", []string{"invalid failing_after 'soon'", "Testfile:2"}},
		{"notify twice", "pingback {\n\tnotify http://a/\n\tnotify http://b/\n}", []string{"notify specified more than once", "Testfile:3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseGlobalOption(caddyfile.NewTestDispenser(tc.input), nil)
			assertErrHas(t, err, tc.want...)
		})
	}
}

// TestNotifyValidateErrors: notify's range and cross-field checks are in
// Validate, for the Caddyfile and JSON alike.
func TestNotifyValidateErrors(t *testing.T) {
	for _, tc := range []struct {
		name, notify, want string
	}{
		{"url without secret", `{"url": "https://hooks.example/"}`, "notify needs a secret"},
		{"secret without url", `{"secret": "s"}`, "notify secret is set without a url"},
		{"not http", `{"url": "ftp://hooks.example/", "secret": "s"}`, `notify url must be an http or https URL, got "ftp://hooks.example/"`},
		{"no host", `{"url": "https:///x", "secret": "s"}`, "notify url must be an http or https URL"},
		{"negative interval", `{"url": "https://h/", "secret": "s", "interval": "-1m"}`, "notify interval must be positive, got -1m0s"},
		{"negative failing_after", `{"failing_after": "-5m"}`, "failing_after must be positive, got -5m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg caddy.Config
			if err := json.Unmarshal([]byte(`{"apps": {"pingback": {"notify": `+tc.notify+`}}}`), &cfg); err != nil {
				t.Fatal(err)
			}
			assertErrHas(t, caddy.Validate(&cfg), tc.want)
		})
	}
	t.Run("through the Caddyfile", func(t *testing.T) {
		cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n\tpingback {\n\t\tnotify https://hooks.example/\n\t}\n}\n:8080 {\n\trespond 200\n}\n"), nil)
		if err != nil {
			t.Fatal(err)
		}
		var cfg caddy.Config
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			t.Fatal(err)
		}
		assertErrHas(t, caddy.Validate(&cfg), "notify needs a secret")
	})
}

// TestNotifySecretResolvedAtStart: the secret's placeholder is resolved
// when the app starts, and a secret that resolves to nothing stops the
// start with a reason.
func TestNotifySecretResolvedAtStart(t *testing.T) {
	a := &App{Notify: &NotifyConfig{URL: "http://127.0.0.1:9/", Secret: "{env.PINGBACK_TEST_NOTIFY_UNSET}"}}
	if _, err := a.newNotifier(); err == nil || err.Error() != "notify secret is empty once its placeholders are resolved (is the environment variable set?)" {
		t.Errorf("unset secret: %v", err)
	}
	rcv := newNotifyReceiver(t, "from-env")
	t.Setenv("PINGBACK_TEST_NOTIFY_SECRET", "from-env")
	a = &App{Notify: &NotifyConfig{URL: rcv.srv.URL, Secret: "{env.PINGBACK_TEST_NOTIFY_SECRET}"}, now: time.Now}
	a.logger = caddy.Log()
	n, err := a.newNotifier()
	if err != nil {
		t.Fatal(err)
	}
	n.Start()
	defer n.Stop()
	n.Notify(notify.Event{Name: EventStoreUnavailable})
	waitNotified(t, rcv, EventStoreUnavailable, "", 1) // the receiver checks the signature with "from-env"
}

// notifyReceiver is a notify endpoint on loopback: it checks each POST's
// signature with its secret (a wrong one is a test error and answered
// 401) and keeps the raw bodies and messages.
type notifyReceiver struct {
	secret string
	srv    *httptest.Server

	mu     sync.Mutex
	fail   int // POSTs still to refuse with 500
	bodies [][]byte
	msgs   []notify.Message
}

func newNotifyReceiver(t *testing.T, secret string) *notifyReceiver {
	t.Helper()
	r := &notifyReceiver{secret: secret}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		if req.Header.Get("Content-Type") != "application/json" {
			t.Errorf("notify POST with content type %q", req.Header.Get("Content-Type"))
		}
		if got, want := req.Header.Get(notify.SignatureHeader), notify.Sign([]byte(r.secret), body); got != want {
			t.Errorf("notify POST signed %q, want %q", got, want)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.fail > 0 {
			r.fail--
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		var msgs []notify.Message
		if err := json.Unmarshal(body, &msgs); err != nil {
			t.Errorf("notify body %s: %v", body, err)
		}
		r.bodies = append(r.bodies, body)
		r.msgs = append(r.msgs, msgs...)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// messages returns the messages of event about provider received so far.
func (r *notifyReceiver) messages(event, provider string) []notify.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []notify.Message
	for _, m := range r.msgs {
		if m.Event == event && m.Provider == provider {
			out = append(out, m)
		}
	}
	return out
}

// raw returns every body received, concatenated.
func (r *notifyReceiver) raw() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []byte
	for _, b := range r.bodies {
		out = append(out, b...)
	}
	return out
}

// waitNotified waits until the messages of event about provider count
// total in all, and returns them.
func waitNotified(t *testing.T, r *notifyReceiver, event, provider string, total int) []notify.Message {
	t.Helper()
	var got []notify.Message
	testkit.WaitFor(t, 30*time.Second, fmt.Sprintf("%d %s of %q notified", total, event, provider), func() bool {
		got = r.messages(event, provider)
		n := 0
		for _, m := range got {
			n += m.Count
		}
		return n >= total
	})
	return got
}
