package pingback

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
)

// TestCaddyfileAdapt runs the golden files in testdata/caddyfile_adapt, in
// Caddy's own format: a Caddyfile, a line "----------", then either the
// expected JSON (tab-indented) or a substring of the expected adapt error.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "caddyfile_adapt", "*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no golden files in testdata/caddyfile_adapt")
	}
	newlines := regexp.MustCompile(`\r?\n`)
	for _, file := range files {
		name := filepath.Base(file)
		t.Run(strings.TrimSuffix(name, ".caddyfiletest"), func(t *testing.T) {
			caddyfileText, expected := goldenParts(t, file)
			expected = newlines.ReplaceAllString(expected, "\n")
			if strings.HasPrefix(expected, "{") {
				if !caddytest.CompareAdapt(t, name, caddyfileText, "caddyfile", expected) {
					t.Errorf("adapted JSON of %s differs from the golden file (diff on stdout)", name)
				}
				return
			}
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileText), nil)
			if err == nil {
				t.Fatalf("adapting %s: got no error, want one containing %q", name, expected)
			}
			if got := newlines.ReplaceAllString(err.Error(), "\n"); !strings.Contains(got, expected) {
				t.Errorf("adapting %s: got error\n%s\nwant it to contain\n%s", name, got, expected)
			}
		})
	}
}

// goldenParts splits a golden file into its Caddyfile and expected parts.
func goldenParts(t *testing.T, file string) (caddyfileText, expected string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(string(data), "----------")
	if len(parts) != 2 {
		t.Fatalf("%s: want exactly one ---------- separator, got %d parts", file, len(parts))
	}
	return strings.TrimSpace(parts[0]) + "\n", strings.TrimSpace(parts[1])
}

// adaptToApps adapts a Caddyfile and returns the config's apps.
func adaptToApps(t *testing.T, text string) map[string]json.RawMessage {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(text), nil)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, text)
	}
	var cfg struct {
		Apps map[string]json.RawMessage `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Apps
}

// pingbackHandlersIn returns every pingback handler in the adapted http app,
// at any depth of subroutes.
func pingbackHandlersIn(t *testing.T, httpApp json.RawMessage) []Handler {
	t.Helper()
	var tree any
	if err := json.Unmarshal(httpApp, &tree); err != nil {
		t.Fatal(err)
	}
	var out []Handler
	eachJSONObject(tree, func(v map[string]any) {
		if v["handler"] != "pingback" {
			return
		}
		raw, _ := json.Marshal(v)
		var h Handler
		if err := json.Unmarshal(raw, &h); err != nil {
			t.Fatalf("handler JSON %s: %v", raw, err)
		}
		out = append(out, h)
	})
	return out
}

// eachJSONObject calls fn on every object in the decoded JSON v, at any
// depth, each before its members are visited.
func eachJSONObject(v any, fn func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		fn(x)
		for _, e := range x {
			eachJSONObject(e, fn)
		}
	case []any:
		for _, e := range x {
			eachJSONObject(e, fn)
		}
	}
}

// TestAdaptedJSONRoundTrip decodes the JSON adapted from the README-style
// example into the module types: what the Caddyfile says is what the
// modules get.
func TestAdaptedJSONRoundTrip(t *testing.T) {
	text, _ := goldenParts(t, filepath.Join("testdata", "caddyfile_adapt", "readme_example_all_options.caddyfiletest"))
	apps := adaptToApps(t, text)

	var app App
	dec := json.NewDecoder(strings.NewReader(string(apps["pingback"])))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&app); err != nil {
		t.Fatalf("decoding pingback app %s: %v", apps["pingback"], err)
	}
	if app.StorageDir != "/var/lib/caddy/pingback" || time.Duration(app.Retention) != 48*time.Hour {
		t.Errorf("app: storage_dir %q retention %s", app.StorageDir, time.Duration(app.Retention))
	}
	want := ReplayConfig{
		BackoffMin:     caddy.Duration(2 * time.Second),
		BackoffMax:     caddy.Duration(5 * time.Minute),
		MaxAttempts:    10,
		ForwardTimeout: caddy.Duration(90 * time.Second),
		Concurrency:    8,
	}
	if app.Replay == nil || *app.Replay != want {
		t.Errorf("replay: got %+v, want %+v", app.Replay, want)
	}
	// Encoding it again gives the same JSON.
	if again := caddyconfig.JSON(&app, nil); !sameJSON(t, again, apps["pingback"]) {
		t.Errorf("re-encoded app %s differs from adapted %s", again, apps["pingback"])
	}

	hs := pingbackHandlersIn(t, apps["http"])
	if len(hs) != 1 {
		t.Fatalf("got %d pingback handlers, want 1", len(hs))
	}
	h := hs[0]
	if h.Provider != "2captcha" || time.Duration(h.AckTimeout) != 1500*time.Millisecond || h.MaxBody != 128<<10 {
		t.Errorf("handler: provider %q ack_timeout %s max_body %d", h.Provider, time.Duration(h.AckTimeout), h.MaxBody)
	}
}

// TestAppJSONAcceptsDurationStrings: hand-written JSON configs may spell
// durations as strings, as elsewhere in Caddy.
func TestAppJSONAcceptsDurationStrings(t *testing.T) {
	var app App
	err := json.Unmarshal([]byte(`{"retention":"36h","replay":{"backoff_min":"1s","backoff_max":"30s","forward_timeout":"2m"}}`), &app)
	if err != nil {
		t.Fatal(err)
	}
	r := app.Replay
	if time.Duration(app.Retention) != 36*time.Hour || r == nil || time.Duration(r.BackoffMin) != time.Second ||
		time.Duration(r.BackoffMax) != 30*time.Second || time.Duration(r.ForwardTimeout) != 2*time.Minute {
		t.Errorf("got retention %s replay %+v", time.Duration(app.Retention), r)
	}
}

func sameJSON(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return string(ja) == string(jb)
}

// TestCaddyfileExampleAdapts keeps the shipped example valid: it adapts and
// configures the app and at least one pingback handler.
func TestCaddyfileExampleAdapts(t *testing.T) {
	text, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	apps := adaptToApps(t, string(text))
	if _, ok := apps["pingback"]; !ok {
		t.Error("Caddyfile.example: no pingback app in the adapted config")
	}
	hs := pingbackHandlersIn(t, apps["http"])
	if len(hs) == 0 {
		t.Fatal("Caddyfile.example: no pingback handler in the adapted config")
	}
	for _, h := range hs {
		if _, err := lookupProvider(h.Provider); err != nil {
			t.Errorf("Caddyfile.example: %v", err)
		}
	}
}

func TestHandlerUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input string
		want  Handler
	}{
		{"pingback {\n\tprovider captchaai\n}", Handler{Provider: "captchaai"}},
		{"pingback {\n\tprovider rucaptcha\n\tack_timeout 3s\n\tmax_body 1MiB\n}", Handler{Provider: "rucaptcha", AckTimeout: caddy.Duration(3 * time.Second), MaxBody: 1 << 20}},
		{"pingback {\n\tmax_body 4096\n\tprovider 2captcha\n\tack_timeout 250ms\n}", Handler{Provider: "2captcha", AckTimeout: caddy.Duration(250 * time.Millisecond), MaxBody: 4096}},
		{"pingback {\n\tprovider 2captcha\n\tverify res_php\n\tunknown_ids reject\n\tmax_quarantine 50 1MiB\n}",
			Handler{Provider: "2captcha", Verify: VerifyResPHP, UnknownIDs: UnknownReject, MaxQuarantine: 50, MaxQuarantineBytes: 1 << 20}},
		{"pingback {\n\tprovider 2captcha\n\tmax_quarantine 7\n}", Handler{Provider: "2captcha", MaxQuarantine: 7}},
	} {
		var h Handler
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
			t.Errorf("%q: %v", tc.input, err)
			continue
		}
		if h.Provider != tc.want.Provider || h.AckTimeout != tc.want.AckTimeout || h.MaxBody != tc.want.MaxBody ||
			h.Verify != tc.want.Verify || h.UnknownIDs != tc.want.UnknownIDs || h.MaxQuarantine != tc.want.MaxQuarantine || h.MaxQuarantineBytes != tc.want.MaxQuarantineBytes {
			t.Errorf("%q: got %+v, want %+v", tc.input, h, tc.want)
		}
	}
}

// TestHandlerCaddyfileErrors: every mistake in the handler directive is a
// parse error that names the line and the offending token.
func TestHandlerCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  []string // substrings of the error
	}{
		{"unknown subdirective", "pingback {\n\tprovider captchaai\n\ttimeout 5s\n}",
			[]string{"unrecognized pingback subdirective 'timeout'", "Testfile:3"}},
		{"repeated provider", "pingback {\n\tprovider captchaai\n\tack_timeout 1s\n\tprovider 2captcha\n}",
			[]string{"provider specified more than once", "Testfile:4"}},
		{"repeated max_body", "pingback {\n\tprovider captchaai\n\tmax_body 1KiB\n\tmax_body 2KiB\n}",
			[]string{"max_body specified more than once", "Testfile:4"}},
		{"missing provider", "pingback {\n\tack_timeout 1s\n}",
			[]string{"provider is required", "Testfile:3"}},
		{"missing provider without block", "pingback",
			[]string{"provider is required", "Testfile:1"}},
		{"unknown provider", "pingback {\n\tprovider deathbycaptcha\n}",
			[]string{`unknown provider "deathbycaptcha"`, "captchaai", "Testfile:2"}},
		{"provider without value", "pingback {\n\tprovider\n}",
			[]string{"wrong argument count", "'provider'", "Testfile:2"}},
		{"provider with two values", "pingback {\n\tprovider captchaai 2captcha\n}",
			[]string{"wrong argument count", "'2captcha'", "Testfile:2"}},
		{"bad ack_timeout", "pingback {\n\tprovider captchaai\n\tack_timeout soon\n}",
			[]string{"invalid ack_timeout 'soon'", "Testfile:3"}},
		{"ack_timeout extra arg", "pingback {\n\tprovider captchaai\n\tack_timeout 1s 2s\n}",
			[]string{"wrong argument count", "'2s'", "Testfile:3"}},
		{"bad max_body", "pingback {\n\tprovider captchaai\n\tmax_body lots\n}",
			[]string{"invalid max_body 'lots'", "Testfile:3"}},
		{"negative max_body", "pingback {\n\tprovider captchaai\n\tmax_body -1\n}",
			[]string{"invalid max_body '-1'", "Testfile:3"}},
		{"bad verify", "pingback {\n\tprovider captchaai\n\tverify hmac\n}",
			[]string{"invalid verify 'hmac'", "token, res_php, none", "Testfile:3"}},
		{"bad unknown_ids", "pingback {\n\tprovider captchaai\n\tunknown_ids drop\n}",
			[]string{"invalid unknown_ids 'drop'", "Testfile:3"}},
		{"bad max_quarantine", "pingback {\n\tprovider captchaai\n\tmax_quarantine 0\n}",
			[]string{"invalid max_quarantine count '0'", "Testfile:3"}},
		{"max_quarantine without args", "pingback {\n\tprovider captchaai\n\tmax_quarantine\n}",
			[]string{"wrong argument count", "Testfile:3"}},
		{"extra args on directive", "pingback extra {\n\tprovider captchaai\n}",
			[]string{"wrong argument count", "'extra'", "Testfile:1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			assertErrHas(t, err, tc.want...)
		})
	}
}

func TestGlobalOptionUnmarshalCaddyfile(t *testing.T) {
	d := caddyfile.NewTestDispenser(`pingback {
		storage_dir /srv/pingback
		retention 72h
		replay {
			backoff 500ms 1m
			max_attempts 3
			forward_timeout 2m
			concurrency 2
		}
		min_free_space 128MiB
	}`)
	v, err := parseGlobalOption(d, nil)
	if err != nil {
		t.Fatal(err)
	}
	opt, ok := v.(httpcaddyfile.App)
	if !ok || opt.Name != "pingback" {
		t.Fatalf("got %#v, want an httpcaddyfile.App named pingback", v)
	}
	var app App
	if err := json.Unmarshal(opt.Value, &app); err != nil {
		t.Fatal(err)
	}
	want := ReplayConfig{
		BackoffMin:     caddy.Duration(500 * time.Millisecond),
		BackoffMax:     caddy.Duration(time.Minute),
		MaxAttempts:    3,
		ForwardTimeout: caddy.Duration(2 * time.Minute),
		Concurrency:    2,
	}
	if app.StorageDir != "/srv/pingback" || time.Duration(app.Retention) != 72*time.Hour || app.MinFreeSpace != 128<<20 ||
		app.Replay == nil || *app.Replay != want {
		t.Errorf("got %+v replay %+v", app, app.Replay)
	}

	// Every option may be left out: an empty block sets nothing, and the
	// app's defaults apply at provisioning.
	v, err = parseGlobalOption(caddyfile.NewTestDispenser("pingback"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(v.(httpcaddyfile.App).Value); got != "{}" {
		t.Errorf("bare option: got %s, want {}", got)
	}
}

// TestGlobalOptionCaddyfileErrors: every mistake in the global option is a
// parse error that names the line and the offending token.
func TestGlobalOptionCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  []string
	}{
		{"unknown option", "pingback {\n\tstorage /tmp/x\n}",
			[]string{"unrecognized pingback option 'storage'", "Testfile:2"}},
		{"unknown replay option", "pingback {\n\treplay {\n\t\tretries 3\n\t}\n}",
			[]string{"unrecognized replay option 'retries'", "Testfile:3"}},
		{"repeated storage_dir", "pingback {\n\tstorage_dir /a\n\tstorage_dir /b\n}",
			[]string{"storage_dir specified more than once", "Testfile:3"}},
		{"repeated replay block", "pingback {\n\treplay {\n\t\tconcurrency 2\n\t}\n\treplay {\n\t\tconcurrency 3\n\t}\n}",
			[]string{"replay specified more than once", "Testfile:5"}},
		{"repeated replay option", "pingback {\n\treplay {\n\t\tmax_attempts 2\n\t\tmax_attempts 3\n\t}\n}",
			[]string{"replay max_attempts specified more than once", "Testfile:4"}},
		{"bad retention", "pingback {\n\tretention forever\n}",
			[]string{"invalid retention 'forever'", "Testfile:2"}},
		{"backoff with one arg", "pingback {\n\treplay {\n\t\tbackoff 5s\n\t}\n}",
			[]string{"backoff takes exactly two durations", "Testfile:3"}},
		{"backoff with three args", "pingback {\n\treplay {\n\t\tbackoff 1s 2s 3s\n\t}\n}",
			[]string{"backoff takes exactly two durations", "Testfile:3"}},
		{"backoff bad min", "pingback {\n\treplay {\n\t\tbackoff quick 1m\n\t}\n}",
			[]string{"invalid backoff min 'quick'", "Testfile:3"}},
		{"backoff bad max", "pingback {\n\treplay {\n\t\tbackoff 1s slow\n\t}\n}",
			[]string{"invalid backoff max 'slow'", "Testfile:3"}},
		{"max_attempts not a number", "pingback {\n\treplay {\n\t\tmax_attempts many\n\t}\n}",
			[]string{"max_attempts must be a whole number, got 'many'", "Testfile:3"}},
		{"bad forward_timeout", "pingback {\n\treplay {\n\t\tforward_timeout 1x\n\t}\n}",
			[]string{"invalid forward_timeout '1x'", "Testfile:3"}},
		{"bad min_free_space", "pingback {\n\tmin_free_space lots\n}",
			[]string{"invalid min_free_space 'lots'", "Testfile:2"}},
		{"concurrency without value", "pingback {\n\treplay {\n\t\tconcurrency\n\t}\n}",
			[]string{"wrong argument count", "'concurrency'", "Testfile:3"}},
		{"extra args on option", "pingback extra {\n\tretention 1h\n}",
			[]string{"wrong argument count", "'extra'", "Testfile:1"}},
		{"extra args on replay", "pingback {\n\treplay now {\n\t\tconcurrency 2\n\t}\n}",
			[]string{"wrong argument count", "'now'", "Testfile:2"}},
		{"extra args on storage_dir", "pingback {\n\tstorage_dir /a /b\n}",
			[]string{"wrong argument count", "'/b'", "Testfile:2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseGlobalOption(caddyfile.NewTestDispenser(tc.input), nil)
			assertErrHas(t, err, tc.want...)
		})
	}

	t.Run("given twice", func(t *testing.T) {
		first := httpcaddyfile.App{Name: "pingback", Value: json.RawMessage(`{}`)}
		_, err := parseGlobalOption(caddyfile.NewTestDispenser("\npingback {\n\tretention 1h\n}"), first)
		assertErrHas(t, err, "pingback global option specified more than once", "Testfile:2")
	})
}

// TestCaddyfileErrorsNameTheLine: through the whole adapter the errors name
// the Caddyfile and the line.
func TestCaddyfileErrorsNameTheLine(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		want        []string
	}{
		{"handler", ":8080 {\n\troute {\n\t\tpingback {\n\t\t\tprovider captchaai\n\t\t\tmax_body 1KiB\n\t\t\tmax_body 2KiB\n\t\t}\n\t}\n}",
			[]string{"max_body specified more than once", "Caddyfile:6"}},
		{"handler with matcher", ":8080 {\n\tpingback /cb/* {\n\t\tprovider\n\t}\n}",
			[]string{"wrong argument count", "'provider'", "Caddyfile:3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(tc.input), nil)
			assertErrHas(t, err, tc.want...)
		})
	}
}

// TestConfigValidateErrors: range and cross-field checks live in Validate,
// so a Caddyfile and the JSON it adapts to are refused alike, when the
// config is loaded (caddy validate, caddy run, /load).
func TestConfigValidateErrors(t *testing.T) {
	site := ":8080 {\n\tpingback {\n\t\tprovider captchaai\n%s\t}\n\trespond 200\n}\n"
	for _, tc := range []struct {
		name, global, handler string
		want                  string
	}{
		{"negative ack_timeout", "", "\t\tack_timeout -2s\n", "ack_timeout must be positive, got -2s"},
		{"max_body above what the store keeps", "", "\t\tmax_body 1MiB\n", "max_body must be between 1 and 524288 bytes"},
		{"negative retention", "retention -1h", "", "retention must be positive"},
		{"backoff min above max", "replay {\n\t\tbackoff 10m 1m\n\t}", "", "replay backoff: need 0 < min <= max, got 10m0s and 1m0s"},
		{"max_attempts 0", "replay {\n\t\tmax_attempts -1\n\t}", "", "replay max_attempts must be at least 1, got -1"},
		{"concurrency -1", "replay {\n\t\tconcurrency -1\n\t}", "", "replay concurrency must be at least 1, got -1"},
		{"negative forward_timeout", "replay {\n\t\tforward_timeout -1s\n\t}", "", "replay forward_timeout must be positive, got -1s"},
		{"stuck_after is gone", "replay {\n\t\tstuck_after 30s\n\t}", "", "replay stuck_after was removed: use forward_timeout"},
		{"poll interval below 5s", "poll {\n\t\tinterval 1s\n\t}", "", "poll interval must be at least 5s, got 1s"},
		{"poll rate above 1000", "poll {\n\t\trate 5000\n\t}", "", "poll rate must be a number of requests per second in (0, 1000], got 5000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caddyfileText := fmt.Sprintf(site, tc.handler)
			if tc.global != "" {
				caddyfileText = "{\n\tpingback {\n\t" + tc.global + "\n\t}\n}\n" + caddyfileText
			}
			cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileText), nil)
			if err != nil {
				t.Fatalf("the parser refused what only Validate should: %v", err)
			}
			var cfg caddy.Config
			if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
				t.Fatal(err)
			}
			assertErrHas(t, caddy.Validate(&cfg), tc.want)
		})
	}

	t.Run("stuck_after in JSON", func(t *testing.T) {
		cfgJSON := `{"apps": {"pingback": {"replay": {"stuck_after": "1m"}}}}`
		var cfg caddy.Config
		if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
			t.Fatal(err)
		}
		assertErrHas(t, caddy.Validate(&cfg), "replay stuck_after was removed: use forward_timeout", "crash recovery is now immediate")
	})
}

func assertErrHas(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", want)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err, w)
		}
	}
}

// TestSecretsOptionsCaddyfile parses keep_headers (pingback), max_answer
// (pingback_track) and result_method (a provider block), and refuses
// their mistakes with the line.
func TestSecretsOptionsCaddyfile(t *testing.T) {
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("pingback {\n\tprovider 2captcha\n\tkeep_headers X-Tenant x-api-key\n}")); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(h.KeepHeaders, []string{"X-Tenant", "x-api-key"}) {
		t.Errorf("keep_headers = %q", h.KeepHeaders)
	}
	if got, err := canonicalHeaderNames(h.KeepHeaders); err != nil || !slices.Equal(got, []string{"X-Tenant", "X-Api-Key"}) {
		t.Errorf("canonical keep_headers = %q, %v", got, err)
	}
	for _, bad := range []string{"", "X Tenant", "X-Tenant:", "Ä"} {
		if _, err := canonicalHeaderNames([]string{bad}); err == nil {
			t.Errorf("keep_headers %q accepted", bad)
		}
	}
	var tr Tracker
	if err := tr.UnmarshalCaddyfile(caddyfile.NewTestDispenser("pingback_track {\n\tprovider 2captcha\n\tmax_answer 2MiB\n}")); err != nil {
		t.Fatal(err)
	}
	if tr.MaxAnswer != 2<<20 {
		t.Errorf("max_answer = %d, want 2 MiB", tr.MaxAnswer)
	}
	if err := (&Tracker{MaxBody: 1, MaxAnswer: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "max_answer") {
		t.Errorf("negative max_answer: %v", err)
	}
	for input, want := range map[string]string{
		"pingback {\n\tprovider 2captcha\n\tkeep_headers\n}":                             "Testfile:3",
		"pingback_track {\n\tprovider 2captcha\n\tmax_answer lots\n}":                    "invalid max_answer 'lots'",
		"pingback_track {\n\tprovider 2captcha\n\tmax_answer 1KiB\n\tmax_answer 2KiB\n}": "max_answer specified more than once",
	} {
		d := caddyfile.NewTestDispenser(input)
		var err error
		if strings.HasPrefix(input, "pingback_track") {
			err = new(Tracker).UnmarshalCaddyfile(d)
		} else {
			err = new(Handler).UnmarshalCaddyfile(d)
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", input, err, want)
		}
	}
	for _, tc := range []struct {
		provider, method, want string
	}{
		{"2captcha", "", http.MethodPost}, {"rucaptcha", "", http.MethodPost}, {"captchaai", "", http.MethodGet},
		{"captchaai", "post", http.MethodPost}, {"2captcha", "GET", http.MethodGet},
	} {
		pc := &ProviderConfig{ResultMethod: tc.method}
		if err := pc.provision(tc.provider, DefaultGiveUp); err != nil {
			t.Fatalf("%s result_method %q: %v", tc.provider, tc.method, err)
		}
		if pc.resMethod != tc.want {
			t.Errorf("%s result_method %q: %s, want %s", tc.provider, tc.method, pc.resMethod, tc.want)
		}
	}
	for provider, method := range map[string]string{"2captcha": "put", "anticaptcha": "post"} {
		if err := (&ProviderConfig{ResultMethod: method}).provision(provider, DefaultGiveUp); err == nil || !strings.Contains(err.Error(), "result_method") {
			t.Errorf("%s result_method %q: %v, want an error", provider, method, err)
		}
	}
}
