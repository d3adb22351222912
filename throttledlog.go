package pingback

import (
	"sync"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// throttledLog keeps a flood of like events (failed forwards during an
// outage, results not stored while the disk is full) from flooding the log:
// the first perWindow events of a window get a line of their own, every
// event is counted by group (a route, say), and flush writes one line per
// group with the window's count, then starts a new window.
type throttledLog struct {
	perWindow int
	maxGroups int    // groups counted apart; the rest are counted under otherGroup
	summary   string // the flush line's message

	mu     sync.Mutex
	lines  int
	counts map[string]int
}

// otherGroup collects the events of groups beyond maxGroups in a window
// (a group may come from request data, such as the Host header).
const otherGroup = "(other)"

func newThrottledLog(perWindow, maxGroups int, summary string) *throttledLog {
	return &throttledLog{perWindow: perWindow, maxGroups: maxGroups, summary: summary, counts: make(map[string]int)}
}

// allow counts an event of group and reports whether it may have a line of
// its own.
func (l *throttledLog) allow(group string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.counts[group]; !ok && len(l.counts) >= l.maxGroups {
		group = otherGroup
	}
	l.counts[group]++
	if l.lines >= l.perWindow {
		return false
	}
	l.lines++
	return true
}

// flush writes the window's counts, one line at level per group that had
// events (the summary, with the group under field and the count), and
// starts a new window.
func (l *throttledLog) flush(logger *zap.Logger, level zapcore.Level, field string) {
	l.mu.Lock()
	counts := l.counts
	l.counts, l.lines = make(map[string]int), 0
	l.mu.Unlock()
	for group, n := range counts {
		if c := logger.Check(level, l.summary); c != nil {
			c.Write(zap.String(field, group), zap.Int("count", n))
		}
	}
}
