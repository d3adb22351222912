package pingback

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// The validated minimums move only with the drill's internal environment,
// never with a config value.
func TestDrillTimerScale(t *testing.T) {
	for _, tc := range []struct {
		env      string
		interval time.Duration
		ok       bool
	}{
		{"", 500 * time.Millisecond, false},
		{"", 5 * time.Second, true},
		{"0.1", 500 * time.Millisecond, true},
		{"0.1", 400 * time.Millisecond, false},
		{"1", 500 * time.Millisecond, false},   // not a scale down
		{"7", 500 * time.Millisecond, false},   // out of range: ignored
		{"abc", 500 * time.Millisecond, false}, // ignored
		{"0.0001", 40 * time.Millisecond, false},
		{"0.0001", 50 * time.Millisecond, true}, // floors
	} {
		t.Run(tc.env+"/"+tc.interval.String(), func(t *testing.T) {
			t.Setenv(drillScaleEnv, tc.env)
			p := &PollConfig{Interval: caddy.Duration(tc.interval), GiveUp: caddy.Duration(DefaultGiveUp), Batch: 1, Rate: 1}
			if err := p.validate(); (err == nil) != tc.ok {
				t.Fatalf("validate: %v, want ok %v", err, tc.ok)
			}
		})
	}
	t.Setenv(drillScaleEnv, "0.1")
	if got := providerBackoffFloor(); got != time.Second {
		t.Errorf("provider back-off floor %s with scale 0.1, want 1s (its own floor)", got)
	}
	if got := pollTick(); got != 100*time.Millisecond {
		t.Errorf("poll tick %s, want 100ms", got)
	}
	if got := (&latencies{}).after(); got != 12*time.Second {
		t.Errorf("auto after %s before samples, want 12s", got)
	}
	t.Setenv(drillScaleEnv, "")
	if providerBackoffFloor() != 5*time.Second || pollTick() != time.Second || (&latencies{}).after() != autoAfterMax {
		t.Error("timers changed without the drill's environment")
	}
}
