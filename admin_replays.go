package pingback

import (
	"context"
	"sync"

	"github.com/caddy-pingback/pingback/internal/store"
)

// JobContext is the context bulk replays run in: it ends at Stop, so a
// reload or a stop cancels them.
func (a *App) JobContext() context.Context { return a.loopCtx }

// ReplayInSlots replays keys, each in a forward slot of the replay loop
// (App.takeSlot) as a bulk replay by hand (App.redrive with
// store.SourceBulk), until ctx ends; done is told after each attempt
// whether the result was delivered. It returns once every attempt it
// started has ended.
func (a *App) ReplayInSlots(ctx context.Context, keys []store.Key, done func(delivered bool)) {
	var wg sync.WaitGroup
	for _, k := range keys {
		if !a.takeSlot(ctx) {
			break
		}
		wg.Go(func() {
			defer a.releaseSlot()
			rec, err := a.redrive(ctx, k, false, store.SourceBulk)
			done(err == nil && rec.State == store.StateDelivered)
		})
	}
	wg.Wait()
}

// takeSlot waits for a free forward slot of the replay loop and takes it;
// false if ctx ended first.
func (a *App) takeSlot(ctx context.Context) bool {
	for {
		a.slotMu.Lock()
		select {
		case a.inflight <- struct{}{}:
			a.slotMu.Unlock()
			return true
		default:
		}
		a.slotMu.Unlock()
		select {
		case <-ctx.Done():
			return false
		case <-a.slotFreed:
		}
	}
}

// releaseSlot gives a forward slot back.
func (a *App) releaseSlot() {
	<-a.inflight
	select {
	case a.slotFreed <- struct{}{}:
	default:
	}
}
