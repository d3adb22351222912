package testkit

import (
	"testing"
	"time"
)

// pollEvery is how often WaitFor and HoldsFor check their condition.
const pollEvery = 10 * time.Millisecond

// WaitFor checks cond every 10ms until it holds, and fails t if it still
// does not after timeout (times Slowdown: 10 times longer under the race
// detector, so that a wait on a condition holds under its slowdown); what
// names the awaited condition in the failure.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	timeout *= Slowdown
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(pollEvery)
	}
}

// HoldsFor checks cond every 10ms for d and fails t as soon as it is false:
// a bounded quiet period, for checking that something does NOT happen.
func HoldsFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if !cond() {
			t.Fatalf("%s stopped holding", what)
		}
		time.Sleep(pollEvery)
	}
}
