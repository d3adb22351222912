package pingback

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestStartupLine checks the start-up line: store and location, polled
// providers, and the replay and poll settings in force.
func TestStartupLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  StoreModule
		kind string
	}{
		{"badger", &BadgerStore{}, "badger"},
		{"postgres", &PostgresStore{}, "postgres"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			a := &App{
				Providers: map[string]*ProviderConfig{"2captcha": {key: "k"}, "capsolver": {}, "anticaptcha": {key: "k2"}},
				Replay: &ReplayConfig{BackoffMin: caddy.Duration(time.Second), BackoffMax: caddy.Duration(30 * time.Second),
					MaxAttempts: 20, Concurrency: 4, ForwardTimeout: caddy.Duration(10 * time.Second)},
				Poll:     &PollConfig{After: caddy.Duration(20 * time.Second), Interval: caddy.Duration(5 * time.Second), GiveUp: caddy.Duration(10 * time.Minute), Batch: 100, Rate: 10},
				storeMod: tc.mod, name: "/data/pingback",
				logger: zap.New(core),
			}
			a.logPlan()
			got := logs.FilterMessage("pingback plugin started").All()
			if len(got) != 1 {
				t.Fatalf("start-up lines: %v", logs.All())
			}
			f := got[0].ContextMap()
			want := map[string]any{
				"store": tc.kind, "location": "/data/pingback", "replay_backoff": "1s to 30s",
				"replay_max_attempts": int64(20), "replay_concurrency": int64(4), "forward_timeout": 10 * time.Second,
				"poll": "after 20s", "poll_interval": 5 * time.Second, "poll_give_up": 10 * time.Minute,
			}
			for k, v := range want {
				if f[k] != v {
					t.Errorf("%s = %#v, want %#v", k, f[k], v)
				}
			}
			if p, ok := f["providers_polled"].([]any); !ok || len(p) != 2 || p[0] != "2captcha" || p[1] != "anticaptcha" {
				t.Errorf("providers_polled = %#v, want [2captcha anticaptcha]", f["providers_polled"])
			}
		})
	}
}
