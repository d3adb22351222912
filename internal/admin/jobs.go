package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
)

// replayJobKept is how long a finished job is still answered.
const replayJobKept = time.Hour

// Jobs are the bulk replays of a process (State.Jobs), by id; finished
// ones are kept for an hour (replayJobKept).
type Jobs struct {
	mu sync.Mutex
	m  map[string]*replayJob
	// ended is when each finished job ended, for forgetting it.
	ended map[string]time.Time
	now   func() time.Time // the clock of ended (time.Now; tests replace it)
}

// NewJobs returns an empty job list.
func NewJobs() *Jobs {
	return &Jobs{m: map[string]*replayJob{}, ended: map[string]time.Time{}, now: time.Now}
}

// replayJob is one bulk replay (POST /pingback/replays): an asynchronous
// job that replays every stored result matching a filter, each as a
// replay by hand, through the replay loop's forward slots
// (Backend.ReplayInSlots): together they never have more forwards in
// flight than its concurrency, and live pingbacks, which take no slot, are
// never held up by them.
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

// add starts a job of matched results, running in ctx until cancelled:
// a random 16-hex-digit id, status running.
func (js *Jobs) add(ctx context.Context, matched int) (*replayJob, context.Context) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	jctx, cancel := context.WithCancel(ctx)
	j := &replayJob{cancel: cancel, state: adminapi.ReplayJobState{ID: hex.EncodeToString(b[:]), Status: "running", Matched: matched}}
	js.mu.Lock()
	js.m[j.state.ID] = j
	js.mu.Unlock()
	return j, jctx
}

// end records that j ended: it is forgotten replayJobKept later.
func (js *Jobs) end(j *replayJob) {
	js.mu.Lock()
	defer js.mu.Unlock()
	js.ended[j.state.ID] = js.now()
}

// lookup returns the job of id, or nil (unknown, or finished more than
// replayJobKept ago).
func (js *Jobs) lookup(id string) *replayJob {
	js.mu.Lock()
	defer js.mu.Unlock()
	for k, t := range js.ended {
		if js.now().Sub(t) > replayJobKept {
			delete(js.m, k)
			delete(js.ended, k)
		}
	}
	return js.m[id]
}
