package pingback

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

func TestLatenciesAfter(t *testing.T) {
	repeat := func(d time.Duration, n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = d
		}
		return out
	}
	steps := func(step time.Duration, n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i+1) * step
		}
		return out
	}
	tests := []struct {
		name    string
		samples []time.Duration
		want    time.Duration
	}{
		{name: "no samples", want: 120 * time.Second},
		{name: "19 samples are too few", samples: repeat(time.Second, 19), want: 120 * time.Second},
		{name: "negative delays are not samples",
			samples: append(repeat(time.Second, 19), -time.Second), want: 120 * time.Second},
		{name: "fast provider clamps to 20s", samples: repeat(time.Second, 20), want: 20 * time.Second},
		// 1s..20s: the 95th percentile is 19s, times 1.5.
		{name: "20 samples", samples: steps(time.Second, 20), want: 28500 * time.Millisecond},
		// 0.5s..50s: the 95th percentile is 47.5s, times 1.5.
		{name: "100 samples", samples: steps(500*time.Millisecond, 100), want: 71250 * time.Millisecond},
		{name: "slow provider clamps to 120s", samples: repeat(100*time.Second, 50), want: 120 * time.Second},
		// Only the most recent 256 delays count: the old slow ones are gone.
		{name: "old samples are replaced",
			samples: append(repeat(200*time.Second, 300), repeat(30*time.Second, 256)...), want: 45 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l latencies
			for _, d := range tc.samples {
				l.observe(d)
			}
			if got := l.after(); got != tc.want {
				t.Errorf("after() = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestBackoffProvider checks the provider backoff: at least 5s or the
// block the answer documents, plus full jitter up to a cap that doubles
// with consecutive failures (5s, 10s, ... up to 10m).
func TestBackoffProvider(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name     string
		failures int // consecutive failures before this one
		ansWait  time.Duration
		jitterOf func(n int64) int64
		wantCap  time.Duration // the jitter bound asked for (exclusive bound n-1)
		want     time.Duration
	}{
		{name: "first failure, no jitter", jitterOf: func(int64) int64 { return 0 },
			wantCap: 5 * time.Second, want: 5 * time.Second},
		{name: "first failure, most jitter", jitterOf: func(n int64) int64 { return n - 1 },
			wantCap: 5 * time.Second, want: 10 * time.Second},
		{name: "third failure, most jitter", failures: 2, jitterOf: func(n int64) int64 { return n - 1 },
			wantCap: 20 * time.Second, want: 25 * time.Second},
		{name: "documented block is the floor", ansWait: 5 * time.Minute, jitterOf: func(int64) int64 { return 0 },
			wantCap: 5 * time.Second, want: 5 * time.Minute},
		{name: "cap stops at 10m", failures: 30, jitterOf: func(n int64) int64 { return n - 1 },
			wantCap: 10 * time.Minute, want: 10*time.Minute + 5*time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var asked int64
			a := &App{logger: zap.NewNop(), jitter: func(n int64) int64 { asked = n; return tc.jitterOf(n) }}
			ps := &providerState{failures: tc.failures}
			a.backoffProvider("2captcha", ps, now, protocol.Answer{Kind: protocol.Backoff, Code: "x", Wait: tc.ansWait})
			if got := ps.blockedUntil.Sub(now); got != tc.want {
				t.Errorf("blocked for %s, want %s", got, tc.want)
			}
			if want := int64(tc.wantCap) + 1; asked != want {
				t.Errorf("jitter drawn in [0, %s), want [0, %s)", time.Duration(asked), time.Duration(want))
			}
			if ps.failures != tc.failures+1 {
				t.Errorf("failures = %d, want %d", ps.failures, tc.failures+1)
			}
		})
	}
}
