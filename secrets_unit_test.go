package pingback

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

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

// TestCredentialHeaders pins which header names admin answers redact.
func TestCredentialHeaders(t *testing.T) {
	for name, want := range map[string]bool{
		"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "Set-Cookie": true, "X-Api-Key": true,
		"Api-Key": true, "X-Auth-Token": true, "X-Client-Secret": true, "X-Session-Id": true, "X-Hub-Signature-256": true,
		"X-Apikey": true, "X-Amz-Security-Token": true, "X-Password": true, "X-Csrf-Token": true,
		"Content-Type": false, "User-Agent": false, "Idempotency-Key": false, "X-Forwarded-For": false, "X-Tenant": false,
		"Accept": false,
	} {
		if got := isCredentialHeader(name); got != want {
			t.Errorf("isCredentialHeader(%q) = %v, want %v", name, got, want)
		}
	}
	h := http.Header{"Authorization": {"Bearer x"}, "X-Tenant": {"t"}, "Cookie": {"a=1", "b=2"}}
	red := redactHeader(h)
	if red.Get("Authorization") != redactedValue || len(red["Cookie"]) != 2 || red["Cookie"][1] != redactedValue || red.Get("X-Tenant") != "t" {
		t.Errorf("redactHeader = %v", red)
	}
	if h.Get("Authorization") != "Bearer x" {
		t.Error("redactHeader changed its argument")
	}
}
