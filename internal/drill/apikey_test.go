package drill

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
)

// TestAPIKeys reads api_key in both of its JSON forms, a string and an
// array of strings, placeholders left as written.
func TestAPIKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   any
		want []string
	}{
		{"absent", nil, nil},
		{"empty string", "", nil},
		{"one key", "{env.KEY_A}", []string{"{env.KEY_A}"}},
		{"array of one", []any{"{env.KEY_A}"}, []string{"{env.KEY_A}"}},
		{"array of two", []any{"{env.KEY_A}", "literal-key"}, []string{"{env.KEY_A}", "literal-key"}},
		{"empty entries left out", []any{"", "k2", ""}, []string{"k2"}},
		{"empty array", []any{}, nil},
		{"not a key", 42.0, nil},
		{"array of non-strings", []any{1.0, true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := apiKeys(tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("apiKeys(%#v) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// keyRecorder serves the simulator and records the key of each balance
// request (res.php's key, getBalance's clientKey).
type keyRecorder struct {
	sim  http.Handler
	mu   sync.Mutex
	keys []string
}

func (k *keyRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if r.Method == http.MethodPost {
		b, _ := io.ReadAll(r.Body)
		var body struct {
			ClientKey string `json:"clientKey"`
		}
		_ = json.Unmarshal(b, &body)
		key = body.ClientKey
		r.Body = io.NopCloser(strings.NewReader(string(b)))
	}
	k.mu.Lock()
	k.keys = append(k.keys, key)
	k.mu.Unlock()
	k.sim.ServeHTTP(w, r)
}

// The provider measurement sends its balance requests with the provider's
// key in either form of api_key: the string, or the first entry of the
// array that resolves to a key (an unset {env.VAR} is skipped).
func TestMeasureProviderBalanceAPIKeyForms(t *testing.T) {
	const envKey = "PINGBACK_DRILL_TEST_KEY_B"
	t.Setenv(envKey, "key-from-env")
	if err := os.Unsetenv("PINGBACK_DRILL_TEST_UNSET"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		apiKey any
		want   string
	}{
		{"string", captchasim.DefaultKey, captchasim.DefaultKey},
		{"array of one", []any{captchasim.DefaultKey}, captchasim.DefaultKey},
		{"array: the first key", []any{captchasim.DefaultKey, "{env." + envKey + "}"}, captchasim.DefaultKey},
		{"array: an unset variable skipped", []any{"{env.PINGBACK_DRILL_TEST_UNSET}", "{env." + envKey + "}"}, "key-from-env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim, err := captchasim.New(captchasim.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer sim.Close()
			rec := &keyRecorder{sim: sim}
			srv := httptest.NewServer(rec)
			defer srv.Close()
			cfg := map[string]any{"apps": map[string]any{"pingback": map[string]any{"providers": map[string]any{
				"2captcha": map[string]any{"endpoint": srv.URL, "api_endpoint": srv.URL, "api_key": tc.apiKey},
			}}}}
			m := measureProviders(context.Background(), cfg, 2, "", afterBounds, io.Discard)
			if len(m.Endpoints) != 2 {
				t.Fatalf("%d endpoints timed, want 2 (legacy and JSON): %+v", len(m.Endpoints), m.Endpoints)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			if len(rec.keys) != 4 {
				t.Fatalf("%d balance requests, want 4", len(rec.keys))
			}
			for _, k := range rec.keys {
				if k != tc.want {
					t.Errorf("a balance request carried key %q, want %q", k, tc.want)
				}
			}
		})
	}
}

// The sandbox counts a provider as polled whichever form its api_key has,
// and gives it the simulator's one key in place of the user's keys,
// saying so when they were several; a provider without api_key stays
// unpolled and gets none.
func TestSandboxAPIKeyForms(t *testing.T) {
	route := func(provider string) any {
		return map[string]any{
			"match": []any{map[string]any{"path": []any{"/cb/" + provider}}},
			"handle": []any{
				map[string]any{"handler": "pingback", "provider": provider},
				map[string]any{"handler": "reverse_proxy", "upstreams": []any{map[string]any{"dial": "localhost:3000"}}},
			},
		}
	}
	cfg := map[string]any{"apps": map[string]any{
		"http": map[string]any{"servers": map[string]any{"srv0": map[string]any{
			"listen": []any{":8080"},
			"routes": []any{route("2captcha"), route("anticaptcha"), route("captchaai")},
		}}},
		"pingback": map[string]any{"providers": map[string]any{
			"2captcha":    map[string]any{"api_key": []any{"{env.TWOCAPTCHA_KEY_A}", "{env.TWOCAPTCHA_KEY_B}"}},
			"anticaptcha": map[string]any{"api_key": "{env.ANTICAPTCHA_KEY}"},
			"captchaai":   map[string]any{},
		}},
	}}
	def := Defaults{PollInterval: 10 * time.Second, GiveUp: time.Hour, BackoffMin: time.Second, BackoffMax: time.Minute,
		AckTimeout: 5 * time.Second, AutoAfterMin: 20 * time.Second, AutoAfterMax: 120 * time.Second}
	sb, err := newSandbox("test.json", cfg, drillOptions{defaults: def}, "127.0.0.1:1", func(string) string { return "http://127.0.0.1:2" })
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sb.Dir)
	var polled []string
	for _, p := range sb.Polled {
		polled = append(polled, p.Provider)
	}
	if want := []string{"2captcha", "anticaptcha"}; !slices.Equal(polled, want) {
		t.Errorf("polled %q, want %q", polled, want)
	}
	provs := sb.JSON["apps"].(map[string]any)["pingback"].(map[string]any)["providers"].(map[string]any)
	for name, want := range map[string]any{"2captcha": drillSimKey, "anticaptcha": drillSimKey, "captchaai": nil} {
		if got := provs[name].(map[string]any)["api_key"]; got != want {
			t.Errorf("provider %s: api_key %#v in the sandbox, want %#v", name, got, want)
		}
	}
	notes := strings.Join(sb.Notes, "\n")
	if !strings.Contains(notes, "provider 2captcha: its 2 api_key keys replaced by the simulator's one key") {
		t.Errorf("notes %q do not say 2captcha's two keys were replaced", notes)
	}
	if strings.Contains(notes, "provider anticaptcha: its") {
		t.Errorf("notes %q speak of anticaptcha's keys, which were one", notes)
	}
}
