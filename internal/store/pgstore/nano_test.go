package pgstore

import (
	"testing"
	"time"
)

// TestPGNanoClamps checks that times outside int64 nanoseconds are
// clamped, not wrapped, for PostgreSQL's bigint columns.
func TestPGNanoClamps(t *testing.T) {
	if got := pgNano(time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)); got != -1<<63 {
		t.Errorf("pgNano(year 1) = %d, want the smallest int64", got)
	}
	if got := pgNano(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)); got != 1<<63-1 {
		t.Errorf("pgNano(year 9999) = %d, want the largest int64", got)
	}
	now := time.Now()
	if got := pgNano(now); got != now.UnixNano() {
		t.Errorf("pgNano(now) = %d, want %d", got, now.UnixNano())
	}
}
