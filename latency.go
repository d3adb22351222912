package pingback

import (
	"slices"
	"sync"
	"time"
)

// Bounds of the automatic "after" (poll config): the delay from submission
// after which a task's pingback counts as overdue.
const (
	autoAfterMin = 20 * time.Second
	autoAfterMax = 120 * time.Second
	// autoAfterSamples is how many recent delays the estimate uses, and
	// autoAfterMinSamples how many it needs before it departs from the
	// conservative autoAfterMax (the tutorial's fixed 120 s).
	autoAfterSamples    = 256
	autoAfterMinSamples = 20
)

// latencies keeps the recent submit-to-pingback delays of one provider and
// derives the automatic "after" from them: 1.5 × their 95th percentile,
// clamped to [20s, 120s]. It lives in memory; after a restart the estimate
// starts again from 120 s.
type latencies struct {
	mu   sync.Mutex
	ring []time.Duration
	next int
}

// observe records one submit-to-pingback delay.
func (l *latencies) observe(d time.Duration) {
	if d < 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ring) < autoAfterSamples {
		l.ring = append(l.ring, d)
		return
	}
	l.ring[l.next] = d
	l.next = (l.next + 1) % autoAfterSamples
}

// after returns the automatic overdue delay.
func (l *latencies) after() time.Duration {
	l.mu.Lock()
	sorted := slices.Clone(l.ring)
	l.mu.Unlock()
	if len(sorted) < autoAfterMinSamples {
		return autoAfterHigh()
	}
	slices.Sort(sorted)
	p95 := sorted[(len(sorted)*95+99)/100-1]
	return min(max(p95*3/2, autoAfterLow()), autoAfterHigh())
}
