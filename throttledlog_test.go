package pingback

import (
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestThrottledLog: the first perWindow events get a line of their own,
// every event is counted in its group's summary, groups beyond maxGroups
// are counted together, and flush starts a new window.
func TestThrottledLog(t *testing.T) {
	l := newThrottledLog(2, 2, "summary")
	var allowed []bool
	for _, g := range []string{"a", "a", "b", "c", "d", "a"} {
		allowed = append(allowed, l.allow(g))
	}
	want := []bool{true, true, false, false, false, false}
	for i := range want {
		if allowed[i] != want[i] {
			t.Errorf("event %d: allowed %v, want %v", i, allowed[i], want[i])
		}
	}
	core, logs := observer.New(zapcore.DebugLevel)
	l.flush(zap.New(core), zapcore.WarnLevel, "route")
	got := map[string]int64{}
	for _, e := range logs.All() {
		if e.Message != "summary" || e.Level != zapcore.WarnLevel {
			t.Errorf("line %q at %s, want the summary at warn", e.Message, e.Level)
		}
		got[e.ContextMap()["route"].(string)] = e.ContextMap()["count"].(int64)
	}
	if len(got) != 3 || got["a"] != 3 || got["b"] != 1 || got[otherGroup] != 2 {
		t.Errorf("summary counts %v, want a:3 b:1 %s:2", got, otherGroup)
	}
	if !l.allow("e") {
		t.Error("after flush, a new window's first event has no line of its own")
	}
}
