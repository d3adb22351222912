package pingback

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// agesEvery bounds how often a shared store is asked for its ages
// (store.Counter.Ages): on PostgreSQL that is a few index descents per
// provider, shared by every scrape and GET /pingback/status within it; an
// age gauge is then at most this stale. Badger keeps them in memory and is
// asked every time.
const agesEvery = time.Second

// agesCache holds the last ages read, and of which store.
var agesCache struct {
	sync.Mutex
	st   store.Store
	at   time.Time
	ages store.Ages
}

// currentAges returns st's ages, read at most once per agesEvery; false
// if the store could not answer.
func currentAges(ctx context.Context, st store.Store) (store.Ages, bool) {
	if _, inMemory := st.(*store.Badger); inMemory {
		ages, err := st.Ages(ctx)
		return ages, err == nil
	}
	agesCache.Lock()
	defer agesCache.Unlock()
	if agesCache.st == st && time.Since(agesCache.at) < agesEvery {
		return agesCache.ages, true
	}
	ages, err := st.Ages(ctx)
	if err != nil {
		return store.Ages{}, false
	}
	agesCache.st, agesCache.at, agesCache.ages = st, time.Now(), ages
	return ages, true
}

// ageAt is how long before now t was, in seconds; 0 for the zero time
// (nothing to age) and never negative.
func ageAt(t, now time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return max(0, now.Sub(t).Seconds())
}

// roundAge rounds an age to the millisecond, for JSON.
func roundAge(s float64) float64 { return math.Round(s*1000) / 1000 }
