package pingback

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

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

// replayFilter selects the results of a bulk replay or a purge.
type replayFilter struct {
	Provider string      `json:"provider,omitempty"`
	State    store.State `json:"state,omitempty"`
	// ReceivedAfter and ReceivedBefore bound the results' received_at
	// (RFC 3339), both exclusive.
	ReceivedAfter  string `json:"received_after,omitempty"`
	ReceivedBefore string `json:"received_before,omitempty"`

	after, before time.Time
}

// parse checks f and fills in its times.
func (f *replayFilter) parse() error {
	if f.Provider != "" {
		if _, err := lookupProvider(f.Provider); err != nil {
			return err
		}
	}
	if f.State != "" && !slices.Contains(store.States, f.State) {
		return fmt.Errorf("unknown state %q (queued, forwarding, delivered, failed, rejected or parked)", f.State)
	}
	for _, x := range []struct {
		name string
		v    string
		t    *time.Time
	}{{"received_after", f.ReceivedAfter, &f.after}, {"received_before", f.ReceivedBefore, &f.before}} {
		if x.v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, x.v)
		if err != nil {
			return fmt.Errorf("%s must be an RFC 3339 time: %v", x.name, err)
		}
		*x.t = t
	}
	return nil
}

// matches reports whether rec is within f's received range.
func (f *replayFilter) matches(rec *store.Record) bool {
	return (f.after.IsZero() || rec.ReceivedAt.After(f.after)) && (f.before.IsZero() || rec.ReceivedAt.Before(f.before))
}

// replayJob is one bulk replay; its JSON is what GET /pingback/replays/<id>
// answers.
type replayJob struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	state  replayJobState
}

type replayJobState struct {
	ID string `json:"id"`
	// Status is running, done or cancelled.
	Status string `json:"status"`
	// Matched results were found; Done of them were tried, Delivered
	// reached the app, Failed did not (still failed, rejected or parked
	// again, or refused: delivered in the meantime, or in flight).
	Matched   int `json:"matched"`
	Done      int `json:"done"`
	Delivered int `json:"delivered"`
	Failed    int `json:"failed"`
}

func (j *replayJob) snapshot() replayJobState {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.state
}

func (j *replayJob) update(fn func(s *replayJobState)) {
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
func (a *App) startBulkReplay(ctx context.Context, f replayFilter) (*replayJob, error) {
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
		if f.matches(r) {
			keys = append(keys, r.Key())
		}
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	jctx, cancel := context.WithCancel(a.loopCtx) // a reload or stop cancels it
	j := &replayJob{cancel: cancel, state: replayJobState{ID: hex.EncodeToString(b[:]), Status: "running", Matched: len(keys)}}
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
			j.update(func(s *replayJobState) {
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
	j.update(func(s *replayJobState) { s.Status = status })
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
