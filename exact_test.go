package pingback

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Answers from https://2captcha.com/2captcha-api: Turnstile in
// challenge-page mode (a useragent beside the token) and Amazon WAF (an
// object request).
const (
	exactTurnstile = `{"status":1,"request":"0.4uMMZZdSfsVM8...610cd090","useragent":"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36"}`
	exactAmazonWAF = `{"status":1,"request":{"captcha_voucher":"eyJ0eXAiOiJKV1Qi...","existing_token":"f8ab5749-f916-..."}}`
)

// exactCaddyfile is a config with a Caddy log file, a provider block for
// provider (endpoint the test's provider, the test key) plus extra global
// lines, a pingback route /cb for provider and pingback_track for
// everything else.
func exactCaddyfile(dir, logFile, provider, endpoint, extra string, app *appStub) string {
	return fmt.Sprintf(`{
	admin %s
	http_port %s
	https_port 9443
	grace_period 1ns
	auto_https off
	skip_install_trust
	persist_config off
	log {
		output file %s
		format json
		level INFO
	}
	pingback {
		storage_dir %s
		provider %s {
			endpoint %s
			api_key %s
		}
		%s
	}
}
http://localhost:%[2]s {
	handle /cb {
		pingback {
			provider %[5]s
		}
		reverse_proxy %[9]s
	}
	handle {
		pingback_track {
			provider %[5]s
		}
		reverse_proxy %[6]s
	}
}
`, testAdmin, testHTTPPort, logFile, dir, provider, endpoint, trkKey, extra, app.hostPort())
}

func startExact(t *testing.T, provider, endpoint, extra string, app *appStub) (logFile string) {
	t.Helper()
	dir := t.TempDir()
	logFile = filepath.Join(t.TempDir(), "caddy.log")
	loadCaddyfile(t, exactCaddyfile(dir, logFile, provider, endpoint, extra, app))
	t.Cleanup(func() {
		unloadCaddy(t)
		if t.Failed() {
			logTail(t, logFile, 40)
		}
	})
	return logFile
}

// TestLocalResAnswersAreExact: a structured result (an object request)
// and a result with an extra field (Turnstile's useragent), seen in a
// passed-through res.php answer, are answered locally afterwards exactly as
// the provider answered, byte for byte (today's main answered the object
// as a JSON string and dropped useragent).
func TestLocalResAnswersAreExact(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startExact(t, "2captcha", prov.URL, "", app)
	for id, answer := range map[string]string{"71000000101": exactAmazonWAF, "71000000102": exactTurnstile} {
		prov.answer("res.php", trkAnswer{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json"}, body: []byte(answer)})
		q := "/res.php?key=" + trkKey + "&action=get&json=1&id=" + id
		first := trkDo(t, http.MethodGet, q, "", nil)
		if string(first.body) != answer {
			t.Fatalf("passed-through answer %q, want the provider's %q", first.body, answer)
		}
		n := len(prov.requests("res.php"))
		local := trkDo(t, http.MethodGet, q, "", nil)
		if local.status != http.StatusOK || string(local.body) != answer {
			t.Errorf("local answer %d %q, want the provider's %q", local.status, local.body, answer)
		}
		if ct := local.header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("local answer Content-Type %q", ct)
		}
		if got := len(prov.requests("res.php")); got != n {
			t.Errorf("the local answer reached the provider")
		}
		if rec := getRecord(t, "2captcha", id); string(rec.Answer) != answer {
			t.Errorf("stored answer %q, want the provider's whole answer", rec.Answer)
		}
	}
}

// TestPolledDeliveriesAreExact: a polled result reaches the app as the
// provider's own pingback would, with everything the provider's answer
// held: for a GET provider (captchaai) the pingback URL's own query kept
// byte for byte (today's main sorted and re-encoded it) with id, code and
// Turnstile's useragent appended; for a POST provider the form with
// useragent after id and code (today's main dropped it).
func TestPolledDeliveriesAreExact(t *testing.T) {
	tests := []struct {
		provider, query, id string
		wantURI             func(id string) string
		wantBody            func(id string) string
	}{
		{"captchaai", "z=1&a=%7e&token=S%2Fe+c", "71000000201",
			func(id string) string {
				return "/cb?z=1&a=%7e&token=S%2Fe+c&id=" + id + "&code=0.4uMMZZdSfsVM8...610cd090&useragent=" +
					url.QueryEscape("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36")
			},
			func(string) string { return "" }},
		{"2captcha", "t=B%2b", "71000000202",
			func(string) string { return "/cb?t=B%2b" },
			func(id string) string {
				return "id=" + id + "&code=0.4uMMZZdSfsVM8...610cd090&useragent=" +
					url.QueryEscape("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36")
			}},
	}
	for _, tc := range tests {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			prov := newTrkProvider(t)
			prov.answer("res.php", trkAnswer{status: http.StatusOK, body: []byte(exactTurnstile)})
			startExact(t, tc.provider, prov.URL, pollBlock("after 1s"), app)
			reg := adminRegistration(t, map[string]string{"provider": tc.provider, "id": tc.id, "method": "turnstile",
				"pingback_url": testBase + "/cb?" + tc.query})
			if status, body := adminCall(t, http.MethodPost, reg); status != http.StatusCreated {
				t.Fatalf("registering: %d %s", status, body)
			}
			key := tc.provider + ":" + tc.id
			defer func() {
				if t.Failed() {
					t.Logf("record: %+v", getRecord(t, tc.provider, tc.id))
				}
			}()
			waitFor(t, 10*time.Second, "the polled delivery", func() bool { return app.count(key) > 0 })
			var got seenRequest
			for _, r := range app.requests() {
				if r.Header.Get(HeaderIdempotencyKey) == key {
					got = r
				}
			}
			if got.URI != tc.wantURI(tc.id) || got.Body != tc.wantBody(tc.id) || got.Header.Get(HeaderSource) != "poll" {
				t.Errorf("app got %s %s body %q (source %s)\nwant URI %s body %q",
					got.Method, got.URI, got.Body, got.Header.Get(HeaderSource), tc.wantURI(tc.id), tc.wantBody(tc.id))
			}
			if rec := getRecord(t, tc.provider, tc.id); string(rec.Answer) != exactTurnstile {
				t.Errorf("stored answer %q, want the provider's whole answer", rec.Answer)
			}
			// The app asks res.php itself: answered locally, exactly.
			local := trkDo(t, http.MethodGet, "/res.php?key="+trkKey+"&action=get&json=1&id="+tc.id, "", nil)
			if string(local.body) != exactTurnstile {
				t.Errorf("local answer %q, want %q", local.body, exactTurnstile)
			}
		})
	}
}

// TestConfigErrorsAtStart: mistakes that today's main accepted and only
// met at the first poll (or never) fail when the config loads: an api_key
// placeholder that resolves empty (but `caddy validate` still passes, for a
// machine without the secret), a give_up that leaves no time for a first
// poll (with after auto, 120 s until delays are observed), globally or per
// provider.
func TestConfigErrorsAtStart(t *testing.T) {
	const unset = "PINGBACK_TEST_SURELY_UNSET_KEY"
	os.Unsetenv(unset)
	tests := []struct {
		name, global string
		validateOK   bool
		want         []string
	}{
		{"empty api_key", "provider captchaai {\n\t\t\tapi_key {env." + unset + "}\n\t\t}", true,
			[]string{"provider captchaai", "{env." + unset + "}", "empty"}},
		{"give_up under auto after", "poll {\n\t\t\tgive_up 90s\n\t\t}", false,
			[]string{"give_up (1m30s)", "first poll", "after auto: 2m0s"}},
		{"give_up equal to after", "poll {\n\t\t\tafter 30s\n\t\t\tgive_up 30s\n\t\t}", false,
			[]string{"give_up (30s)", "after 30s"}},
		{"provider give_up under auto after", "provider anticaptcha {\n\t\t\tapi_key k\n\t\t\tgive_up 1m\n\t\t}", false,
			[]string{"provider anticaptcha", "give_up (1m0s)", "first poll"}},
		{"endpoint for a provider without that API", "provider capsolver {\n\t\t\tendpoint https://x.example\n\t\t}", false,
			[]string{"provider capsolver", "endpoint", "no legacy"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cf := caddyfileFor("storage_dir "+dir+"\n\t\t"+tc.global, "")
			cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
			if err != nil {
				t.Fatalf("adapting: %v", err)
			}
			var cfg caddy.Config
			if err := caddy.StrictUnmarshalJSON(cfgJSON, &cfg); err != nil {
				t.Fatal(err)
			}
			verr := caddy.Validate(&cfg)
			if tc.validateOK != (verr == nil) {
				t.Errorf("caddy validate: %v; want ok %v", verr, tc.validateOK)
			}
			err = caddy.Load(cfgJSON, true)
			t.Cleanup(func() { unloadCaddy(t) })
			if err == nil {
				t.Fatal("config loaded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
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
		status, body := adminCall(t, http.MethodPost, adminRegistration(t, tc.fields))
		if status != http.StatusBadRequest || !strings.Contains(string(body), tc.want) {
			t.Errorf("%v: got %d %s, want 400 saying %q", tc.fields, status, body, tc.want)
		}
	}
}

// TestReusedTaskIDIsLogged: a submission whose answer names a task id the
// store already holds is not tracked again, and a warn line says so with
// the id (today's main said nothing).
func TestReusedTaskIDIsLogged(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	prov.answer("in.php", trkAnswer{status: http.StatusOK, body: []byte("OK|71000000401")})
	logFile := startExact(t, "2captcha", prov.URL, "", app)
	submit := func() {
		resp := trkDo(t, http.MethodGet, "/in.php?key="+trkKey+"&method=userrecaptcha&pingback="+url.QueryEscape(trkCallbackURL), "", nil)
		if string(resp.body) != "OK|71000000401" {
			t.Fatalf("submission answered %q", resp.body)
		}
	}
	submit()
	const msg = "submission answered with a task id the store already holds (a reused id): not tracked again"
	if n := len(logEntries(t, logFile, msg)); n != 0 {
		t.Fatalf("%d reuse warnings after the first submission", n)
	}
	submit()
	var entries []map[string]any
	waitFor(t, 5*time.Second, "the reuse warning", func() bool {
		entries = logEntries(t, logFile, msg)
		return len(entries) > 0
	})
	if e := entries[0]; e["level"] != "warn" || e["id"] != "71000000401" || e["provider"] != "2captcha" {
		t.Errorf("warning %v, want level warn naming the id and provider", e)
	}
}
