package pingback

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// Bulk replays (POST /pingback/replays): an asynchronous job replays every
// stored result matching a filter, each as a replay by hand (redrive),
// through the replay loop's forward slots (Replay.Concurrency): together
// they never have more forwards in flight than concurrency, and live
// pingbacks, which take no slot, are never held up by them.
//
// A job lives in the process that started it, in the config that was
// running: a reload or a stop cancels it (status cancelled); another
// instance does not know it (404).

// maxBulkReplay is the most results one job replays; a filter matching
// more replays the first ones in the store's list order.
const maxBulkReplay = 100000

// replayJob is one bulk replay; its JSON is what GET /pingback/replays/<id>
// answers.
type replayJob struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	state  adminapi.ReplayJobState
}

func (j *replayJob) snapshot() adminapi.ReplayJobState {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.state
}

func (j *replayJob) update(fn func(s *adminapi.ReplayJobState)) {
	j.mu.Lock()
	fn(&j.state)
	j.mu.Unlock()
}

// replayJobs are this process's jobs, by id; finished ones are kept for
// an hour.
var replayJobs = struct {
	sync.Mutex
	m map[string]*replayJob
	// ended is when each finished job ended, for forgetting it.
	ended map[string]time.Time
}{m: map[string]*replayJob{}, ended: map[string]time.Time{}}

const replayJobKept = time.Hour

func lookupReplayJob(id string) *replayJob {
	replayJobs.Lock()
	defer replayJobs.Unlock()
	for k, t := range replayJobs.ended {
		if time.Since(t) > replayJobKept {
			delete(replayJobs.m, k)
			delete(replayJobs.ended, k)
		}
	}
	return replayJobs.m[id]
}

// startBulkReplay lists the matching results and starts the job.
func (a *App) startBulkReplay(ctx context.Context, f adminapi.ReplayFilter) (*replayJob, error) {
	st := a.store(time.Second)
	if st == nil {
		return nil, errStoreUnavailable
	}
	recs, err := st.List(ctx, store.Filter{Provider: f.Provider, State: f.State}, maxBulkReplay)
	if err != nil {
		return nil, err
	}
	var keys []store.Key
	for _, r := range recs {
		if f.Matches(r) {
			keys = append(keys, r.Key())
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	jctx, cancel := context.WithCancel(a.loopCtx) // a reload or stop cancels it
	j := &replayJob{cancel: cancel, state: adminapi.ReplayJobState{ID: hex.EncodeToString(b[:]), Status: "running", Matched: len(keys)}}
	replayJobs.Lock()
	replayJobs.m[j.state.ID] = j
	replayJobs.Unlock()
	a.logger.Info("bulk replay started", zap.String("job", j.state.ID), zap.Int("matched", len(keys)),
		zap.String("provider", f.Provider), zap.String("state", string(f.State)))
	go a.runBulkReplay(jctx, j, keys)
	return j, nil
}

// runBulkReplay replays keys, each in a forward slot of the replay loop.
func (a *App) runBulkReplay(ctx context.Context, j *replayJob, keys []store.Key) {
	var wg sync.WaitGroup
	for _, k := range keys {
		if !a.takeSlot(ctx) {
			break
		}
		wg.Go(func() {
			defer a.releaseSlot()
			rec, err := a.redrive(ctx, k, false, store.SourceBulk)
			j.update(func(s *adminapi.ReplayJobState) {
				s.Done++
				if err == nil && rec.State == store.StateDelivered {
					s.Delivered++
				} else {
					s.Failed++
				}
			})
		})
	}
	wg.Wait()
	status := "done"
	if ctx.Err() != nil {
		status = "cancelled"
	}
	j.update(func(s *adminapi.ReplayJobState) { s.Status = status })
	j.cancel()
	replayJobs.Lock()
	replayJobs.ended[j.state.ID] = time.Now()
	replayJobs.Unlock()
	s := j.snapshot()
	a.logger.Info("bulk replay ended", zap.String("job", s.ID), zap.String("status", s.Status),
		zap.Int("matched", s.Matched), zap.Int("delivered", s.Delivered), zap.Int("failed", s.Failed))
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

var errNoJob = errors.New("no such bulk replay in this process (jobs live in the instance that started them)")
