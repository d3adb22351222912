package pingback

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// handleStartReplays answers POST /pingback/replays: the body is a JSON
// filter {"provider", "state" (default "parked"), "received_after",
// "received_before"} (RFC 3339 times); it starts a bulk replay and
// answers 202 {"id", "status": "running", ...} with a Location header,
// 400 for a bad filter, 503 while the store is not open.
func handleStartReplays(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use POST", r.Method)}
	}
	f, err := decodeFilter(r, store.StateParked)
	if err != nil {
		return err
	}
	if f.State == store.StateDelivered || f.State == store.StateForwarding || f.State == store.StateQuarantined {
		return badInput("state %s cannot be replayed in bulk (use failed, rejected, parked or queued; quarantined results are released one by one)", f.State)
	}
	a, err := activeApp()
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	j, err := a.startBulkReplay(r.Context(), f)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: err}
	}
	s := j.snapshot()
	w.Header().Set("Location", "/pingback/replays/"+s.ID)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	return json.NewEncoder(w).Encode(s)
}

// handleReplayJob answers GET /pingback/replays/<id> (the job's progress)
// and DELETE (cancels it; answers the job), 404 for a job this process
// does not know.
func handleReplayJob(w http.ResponseWriter, r *http.Request) error {
	id := strings.TrimPrefix(r.URL.Path, "/pingback/replays/")
	if id == "" || strings.Contains(id, "/") {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("not found: use /pingback/replays/<id>")}
	}
	if r.Method != http.MethodGet && r.Method != http.MethodDelete {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET or DELETE", r.Method)}
	}
	j := lookupReplayJob(id)
	if j == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("bulk replay %s: %w", id, errNoJob)}
	}
	if r.Method == http.MethodDelete {
		j.cancel()
	}
	return writeJSON(w, j.snapshot())
}

// maxBulkReplay is the most results one job replays; a filter matching
// more replays the first ones in the store's list order.
const maxBulkReplay = 100000

// replayJob is one bulk replay (POST /pingback/replays): an asynchronous
// job that replays every stored result matching a filter, each as a
// replay by hand (redrive), through the replay loop's forward slots
// (Replay.Concurrency): together they never have more forwards in flight
// than concurrency, and live pingbacks, which take no slot, are never held
// up by them.
//
// A job lives in the process that started it, in the config that was
// running: a reload or a stop cancels it (status cancelled); another
// instance does not know it (404). Its state is what
// GET /pingback/replays/<id> answers.
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
