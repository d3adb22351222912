package pingback

import (
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestClassifyText(t *testing.T) {
	tests := []struct {
		text string
		kind answerKind
		wait time.Duration
	}{
		// Not ready: both spellings (the provider's own is CAPCHA_).
		{text: "CAPCHA_NOT_READY", kind: answerNotReady},
		{text: "CAPTCHA_NOT_READY", kind: answerNotReady},
		// Results: tokens, short texts, tokens with "|".
		{text: "03AGdBq24PBCbwiDRaS_MJ7Z", kind: answerResult},
		{text: "W9H5K", kind: answerResult},
		{text: "1d9c8e.2|r=eu-west-1|meta=3", kind: answerResult},
		// Task-final errors reach the app as its result.
		{text: "ERROR_CAPTCHA_UNSOLVABLE", kind: answerTaskError},
		{text: "ERROR_BAD_DUPLICATES", kind: answerTaskError},
		// The provider does not know the task (any more): it expires.
		{text: "ERROR_WRONG_CAPTCHA_ID", kind: answerUnknownTask},
		{text: "ERROR_WRONG_ID_FORMAT", kind: answerUnknownTask},
		// Key errors stop polling the provider.
		{text: "ERROR_WRONG_USER_KEY", kind: answerKeyError},
		{text: "ERROR_KEY_DOES_NOT_EXIST", kind: answerKeyError},
		// Account and rate conditions back off, at least as long as documented.
		{text: "ERROR_NO_SLOT_AVAILABLE", kind: answerBackoff, wait: 5 * time.Second},
		{text: "MAX_USER_TURN", kind: answerBackoff, wait: 10 * time.Second},
		{text: "ERROR_ZERO_BALANCE", kind: answerBackoff, wait: time.Minute},
		{text: "IP_BANNED", kind: answerBackoff, wait: 5 * time.Minute},
		{text: "ERROR: 1001", kind: answerBackoff, wait: 10 * time.Minute},
		{text: "ERROR: 1005", kind: answerBackoff, wait: 5 * time.Minute},
		{text: "ERROR: 1099", kind: answerBackoff, wait: 5 * time.Minute},
		// Anything else that looks like an error is never delivered as a
		// result, nor is an empty answer.
		{text: "ERROR_SOMETHING_NEW", kind: answerBackoff},
		{text: "", kind: answerBackoff},
	}
	for _, tc := range tests {
		t.Run(tc.text, func(t *testing.T) {
			got := classifyText(tc.text)
			if got.kind != tc.kind || got.text != tc.text || got.wait != tc.wait {
				t.Errorf("classifyText(%q) = {kind %d, text %q, wait %s}, want {kind %d, text %q, wait %s}",
					tc.text, got.kind, got.text, got.wait, tc.kind, tc.text, tc.wait)
			}
		})
	}
}

func TestParseResAnswer(t *testing.T) {
	type want struct {
		kind answerKind
		text string
	}
	tests := []struct {
		name    string
		body    string
		n       int
		want    []want
		wantErr bool
	}{
		{name: "single result", n: 1,
			body: `{"status":1,"request":"03AGdBq24PBCbwiDRaS"}`,
			want: []want{{answerResult, "03AGdBq24PBCbwiDRaS"}}},
		{name: "single result containing a pipe is not split", n: 1,
			body: `{"status":1,"request":"a1.2|r=eu-west-1|meta=3"}`,
			want: []want{{answerResult, "a1.2|r=eu-west-1|meta=3"}}},
		{name: "single not ready", n: 1,
			body: `{"status":0,"request":"CAPCHA_NOT_READY"}`,
			want: []want{{answerNotReady, "CAPCHA_NOT_READY"}}},
		{name: "single unsolvable", n: 1,
			body: `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`,
			want: []want{{answerTaskError, "ERROR_CAPTCHA_UNSOLVABLE"}}},
		{name: "status 0 is never a result", n: 1,
			body: `{"status":0,"request":"LOOKS_LIKE_A_TOKEN"}`,
			want: []want{{answerBackoff, "LOOKS_LIKE_A_TOKEN"}}},
		{name: "status 0 for a bulk request is one code", n: 3,
			body: `{"status":0,"request":"ERROR_WRONG_USER_KEY"}`,
			want: []want{{answerKeyError, "ERROR_WRONG_USER_KEY"}}},
		{name: "status 0 no slot for a bulk request", n: 2,
			body: `{"status":0,"request":"ERROR_NO_SLOT_AVAILABLE"}`,
			want: []want{{answerBackoff, "ERROR_NO_SLOT_AVAILABLE"}}},
		{name: "bulk, one element per id in order", n: 4,
			body: `{"status":1,"request":"TOKEN-A|CAPCHA_NOT_READY|ERROR_CAPTCHA_UNSOLVABLE|ERROR_WRONG_CAPTCHA_ID"}`,
			want: []want{
				{answerResult, "TOKEN-A"},
				{answerNotReady, "CAPCHA_NOT_READY"},
				{answerTaskError, "ERROR_CAPTCHA_UNSOLVABLE"},
				{answerUnknownTask, "ERROR_WRONG_CAPTCHA_ID"},
			}},
		{name: "bulk with an element missing returns what it got", n: 3,
			body: `{"status":1,"request":"TOKEN-A|TOKEN-B"}`,
			want: []want{{answerResult, "TOKEN-A"}, {answerResult, "TOKEN-B"}}},
		{name: "numeric request", n: 1,
			body: `{"status":1,"request":12345678901}`,
			want: []want{{answerResult, "12345678901"}}},
		{name: "object request is kept as its JSON text", n: 1,
			body: `{"status":1,"request":{"captcha_voucher":"v","existing_token":"t"}}`,
			want: []want{{answerResult, `{"captcha_voucher":"v","existing_token":"t"}`}}},
		{name: "empty single result is not a result", n: 1,
			body: `{"status":1,"request":""}`,
			want: []want{{answerBackoff, ""}}},
		{name: "HTML error page", n: 1, wantErr: true,
			body: "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"},
		{name: "plain text answer", n: 1, wantErr: true, body: "OK|TOKEN"},
		{name: "empty body", n: 1, wantErr: true, body: ""},
		{name: "JSON without request", n: 1, wantErr: true, body: `{"status":1}`},
		{name: "JSON null request", n: 1, wantErr: true, body: `{"status":1,"request":null}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseResAnswer([]byte(tc.body), tc.n)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("parseResAnswer(%q) = %+v, want an error", tc.body, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseResAnswer(%q): %v", tc.body, err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("parseResAnswer(%q) gave %d answers, want %d: %+v", tc.body, len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				if got[i].kind != w.kind || got[i].text != w.text {
					t.Errorf("answer %d = {kind %d, text %q}, want {kind %d, text %q}", i, got[i].kind, got[i].text, w.kind, w.text)
				}
			}
		})
	}
}

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
			a.backoffProvider("2captcha", ps, now, answer{kind: answerBackoff, text: "x", wait: tc.ansWait})
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
