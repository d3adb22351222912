// Package pingback is a Caddy v2 plugin that makes captcha-solver pingbacks
// (CaptchaAI, 2captcha, rucaptcha, anti-captcha, CapMonster, CapSolver)
// reliable in front of an unchanged app:
// the pingback handler stores every result durably before answering 200,
// deduplicates re-deliveries and forwards to the app through the next
// handler (normally reverse_proxy); failed forwards stay in a dead-letter
// queue that the pingback app replays with backoff.
package pingback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyevents"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/admin"
)

func init() {
	caddy.RegisterModule(new(App))
}

// Defaults of the app's configuration.
const (
	DefaultRetention      = 24 * time.Hour
	DefaultBackoffMin     = 5 * time.Second
	DefaultBackoffMax     = 10 * time.Minute
	DefaultMaxAttempts    = 20
	DefaultForwardTimeout = time.Minute
	DefaultConcurrency    = 4
)

// App is the pingback app: it owns the durable store (one Badger database
// per directory per process, shared across config reloads) and runs the
// replay loop that redelivers the dead-letter queue. Pingback handlers find
// it with ctx.App("pingback"); without a global `pingback` option it runs
// with the defaults.
type App struct {
	// Directory of the Badger database. Default: the "pingback" folder in
	// Caddy's data directory (caddy.AppDataDir()). Two configs that name
	// the same directory share one open database.
	StorageDir string `json:"storage_dir,omitempty"`

	// The store, a guest module in the namespace pingback.stores:
	// {"module": "badger", "dir": "..."} (the default; storage_dir is its
	// shorthand, and setting both is an error) or {"module": "postgres",
	// "dsn": "..."}, shared by several Caddy instances. Opened in Start.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=pingback.stores inline_key=module"`

	// How long a result is kept after it was received, whatever its state
	// (parked entries included). A result that expires undelivered is
	// counted in caddy_pingback_expired_undelivered_total and logged.
	// Default: 24h.
	Retention caddy.Duration `json:"retention,omitempty"`

	// How long a delivered result keeps its payload (code, answer, other
	// code, request body, headers and query) after its delivery: then it
	// is erased from the store, and the record keeps only its key, state,
	// times, attempts and statuses (payload_erased). More than 0 and at
	// most retention. Results not delivered keep their payload for the
	// whole retention. Default: retention (nothing is erased early).
	KeepPayload *caddy.Duration `json:"keep_payload,omitempty"`

	// Free space, in bytes, below which the store stops taking new results
	// (they are then forwarded without durability: the provider gets 200
	// only if the app accepted, else 503) until space returns; this keeps
	// a full disk from crashing Caddy. Storing resumes by itself within a
	// second of space coming back. Default: badgerstore.DefaultMinFreeSpace (256 MiB).
	MinFreeSpace int64 `json:"min_free_space,omitempty"`

	// How failed forwards are replayed.
	Replay *ReplayConfig `json:"replay,omitempty"`

	// The providers' API settings for the fallback poller, keyed by
	// provider name (captchaai, 2captcha, rucaptcha, anticaptcha,
	// capmonster, capsolver).
	Providers map[string]*ProviderConfig `json:"providers,omitempty"`

	// How tracked tasks whose pingback is overdue are polled.
	Poll *PollConfig `json:"poll,omitempty"`

	// Notifications of the plugin's events: failing_after, and a URL
	// that receives them as signed JSON POSTs.
	Notify *NotifyConfig `json:"notify,omitempty"`

	ctx      caddy.Context
	logger   *zap.Logger
	storeMod StoreModule // the store module (storage_dir: Badger)
	dir      string      // the store's location: the pool key (Badger: the absolute, cleaned directory)
	name     string      // how logs name the store: a directory, or host:port/database

	handle *storeHandle  // set by Start once the store is open; never unset
	ready  chan struct{} // closed when Start has finished, opened or not
	held   bool          // this config holds a pool reference (Cleanup releases it)
	// countsHeld: this config holds a reference to submissionPool's
	// counts (Cleanup releases it).
	countsHeld bool

	adminState *admin.State // the process's admin state, referenced from Start to Cleanup (App.beginStarting)

	stop       chan struct{}
	loopCtx    context.Context // ends at Stop: the loops' store calls and the poller's waits
	loopCancel context.CancelFunc
	loopDone   chan struct{} // closed when the replay loop has returned
	pollDone   chan struct{} // closed when the poll loop has returned
	expiredAt  time.Time     // when the poll loop last expired overdue tasks (expireOverdue)
	// cutCtx ends cutAfter after Stop begins: every forward of this config
	// still running then is cut and recorded as interrupted.
	cutCtx    context.Context
	cutCancel context.CancelFunc
	cutOnce   *sync.Once
	// stopping is closed when the countdown to the cut begins (the
	// config's "stopping" event, or Stop): the replay loop starts no
	// forward after it, since each would only be cut.
	stopping chan struct{}
	// inflight bounds the forwards the replay loop has in flight (replays
	// and polled results together) to Replay.Concurrency.
	inflight chan struct{}
	// slotMu is held while slots of inflight are counted and taken, by
	// the replay loop and by bulk replays ([App.ReplayInSlots]); slotFreed is
	// signalled when a slot is given back.
	slotMu     *sync.Mutex
	slotFreed  chan struct{}
	httpClient *http.Client // for res.php
	probes     *sync.Map    // "<method> <pingback URL>" → probe result (error or nil)
	metrics    *metrics

	// trackers are the providers that have a pingback_track in this
	// config (noteTracker, hasTracker), guarded by trackersMu.
	trackersMu *sync.Mutex
	trackers   map[string]bool
	// submissions are the submissions of the store's location in
	// flight, shared across reloads (submissionPool); Cleanup releases
	// them.
	submissions *submissionCounts

	// now and jitter are the clock and random source of the replay loop;
	// tests replace them.
	now    func() time.Time
	jitter func(n int64) int64
	// confirmWait, if set, replaces the timer of App.confirmAfter: tests
	// set it on the running app before any traffic.
	confirmWait func(ctx context.Context, d time.Duration) bool

	// Events ([App.emitEvent]): the config's events app (nil: none) and
	// the emitter Start starts.
	eventsApp *caddyevents.App
	emitter   *eventEmitter
	// pause is this config's part of pausing deliveries (pauseState).
	pause *pauseState
}

// ReplayConfig configures the replay loop of the dead-letter queue.
type ReplayConfig struct {
	// Delay before the first retry; each retry doubles the cap, and the
	// actual delay is drawn uniformly between BackoffMin and the cap
	// (exponential backoff with full jitter). Default: 5s.
	BackoffMin caddy.Duration `json:"backoff_min,omitempty"`
	// Largest delay between two attempts; it also caps how long an app's
	// Retry-After (on a 429, or a 503) defers a retry and pauses its
	// route's replays. Default: 10m.
	BackoffMax caddy.Duration `json:"backoff_max,omitempty"`
	// Attempts that may end in a retryable failure or a timeout (the live
	// forward included) before the result is parked: kept and visible but
	// no longer retried. Forwards cut by a crash or a reload do not count;
	// five cut by crashes in a row park the result too. Neither do answers
	// that ask for less traffic (429, or 503 with Retry-After): they are
	// failures in the record's history, retried no sooner than their
	// Retry-After, and bounded by retention instead. Default: 20.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// The longest one forward (live, replay or polled delivery) may take;
	// then it is cancelled, recorded as a failed attempt ("app did not
	// answer within forward_timeout") and retried with backoff. While it
	// runs, the forward holds a lease on the result: nothing else delivers
	// it, however long the app takes. Default: 1m.
	ForwardTimeout caddy.Duration `json:"forward_timeout,omitempty"`
	// Replays in flight at most, so a recovering app is not stampeded
	// (replays and polled results together, per process). Half of them
	// (rounded up) go first to due results with at most 2 failures, so a
	// backlog cannot starve a result that just failed; a route that
	// answers 429 (or 503 with Retry-After) gets fewer for a while.
	// Default: 4.
	Concurrency int `json:"concurrency,omitempty"`

	// Removed: a config that sets it fails to load. Use ForwardTimeout;
	// crash recovery no longer waits for a timer.
	StuckAfter caddy.Duration `json:"stuck_after,omitempty"`
}

// CaddyModule returns the Caddy module information. Its receiver is a
// pointer: the events app calls it on the running app (an event's origin),
// which must not copy fields the loops write.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "pingback",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision sets defaults and resolves the storage directory. It does not
// open the database (Start does), so `caddy validate` succeeds while the same
// config runs in another process.
func (a *App) Provision(ctx caddy.Context) error {
	a.ctx = ctx
	a.logger = ctx.Logger()
	a.ready = make(chan struct{})
	a.stop = make(chan struct{})
	a.cutCtx, a.cutCancel = context.WithCancel(context.Background())
	a.cutOnce = new(sync.Once)
	a.stopping = make(chan struct{})
	a.probes = new(sync.Map)
	a.trackersMu = new(sync.Mutex)
	a.pause = new(pauseState)
	if a.httpClient == nil {
		a.httpClient = &http.Client{Timeout: 30 * time.Second}
	}
	if a.now == nil {
		a.now = time.Now
	}
	if a.jitter == nil {
		a.jitter = rand.Int64N
	}
	if a.Retention == 0 {
		a.Retention = caddy.Duration(DefaultRetention)
	}
	if a.KeepPayload == nil {
		keep := a.Retention
		a.KeepPayload = &keep
	}
	if a.Replay == nil {
		a.Replay = new(ReplayConfig)
	}
	r := a.Replay
	if r.BackoffMin == 0 {
		r.BackoffMin = caddy.Duration(DefaultBackoffMin)
	}
	if r.BackoffMax == 0 {
		r.BackoffMax = caddy.Duration(max(DefaultBackoffMax, time.Duration(r.BackoffMin)))
	}
	if r.MaxAttempts == 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.ForwardTimeout == 0 {
		r.ForwardTimeout = caddy.Duration(DefaultForwardTimeout)
	}
	if a.MinFreeSpace == 0 {
		a.MinFreeSpace = badgerstore.DefaultMinFreeSpace
	}
	if r.Concurrency == 0 {
		r.Concurrency = DefaultConcurrency
	}

	if err := a.provisionStore(ctx); err != nil {
		return err
	}
	if err := a.provisionSubmissions(); err != nil {
		return err
	}

	if err := a.provisionPolling(); err != nil {
		return err
	}

	a.watchStopping(ctx)

	m, err := registerMetrics(ctx.GetMetricsRegistry())
	if err != nil {
		return err
	}
	a.metrics = m
	return nil
}

// Validate checks the configuration: every range and cross-field check of
// the app, for JSON and Caddyfile alike.
func (a *App) Validate() error {
	r := a.Replay
	switch {
	case r.StuckAfter != 0:
		return errors.New("replay stuck_after was removed: use forward_timeout, the longest one forward may take (default 1m); crash recovery is now immediate: a forward cut by a crash is replayed as soon as Caddy opens the store again")
	case a.Retention <= 0:
		return fmt.Errorf("retention must be positive, got %s", time.Duration(a.Retention))
	case r.BackoffMin <= 0 || r.BackoffMax < r.BackoffMin:
		return fmt.Errorf("replay backoff: need 0 < min <= max, got %s and %s", time.Duration(r.BackoffMin), time.Duration(r.BackoffMax))
	case r.MaxAttempts < 1:
		return fmt.Errorf("replay max_attempts must be at least 1, got %d", r.MaxAttempts)
	case r.ForwardTimeout <= 0:
		return fmt.Errorf("replay forward_timeout must be positive, got %s", time.Duration(r.ForwardTimeout))
	case r.Concurrency < 1:
		return fmt.Errorf("replay concurrency must be at least 1, got %d", r.Concurrency)
	case a.MinFreeSpace < 0:
		return fmt.Errorf("min_free_space must not be negative, got %d", a.MinFreeSpace)
	}
	if err := a.validateKeepPayload(); err != nil {
		return err
	}
	if err := a.validateNotify(); err != nil {
		return err
	}
	return a.validatePolling()
}

// Start opens the store (or takes another reference to the one a running
// config already opened on the same directory) and starts the replay loop.
// A store that cannot be opened stops Caddy: the plugin never runs without
// persistence. While Start runs, the admin API answers 503 "starting: the
// store is opening" unless a running config's store answers (App.beginStarting).
func (a *App) Start() error {
	a.beginStarting()
	defer a.endStarting()
	defer close(a.ready)
	if err := a.checkProviderKeys(); err != nil {
		return err
	}
	if err := a.startEvents(); err != nil {
		return err
	}
	opening := time.Now()
	v, loaded, err := stores.LoadOrNew(a.dir, func() (caddy.Destructor, error) {
		return openStoreHandle(a.storeMod, a.MinFreeSpace, a.logger, a.legacyAccounts())
	})
	opened := time.Since(opening)
	if err != nil {
		return fmt.Errorf("pingback storage: %w", err)
	}
	a.held = true
	a.handle = v.(*storeHandle)
	if loaded && a.handle.minFree != a.MinFreeSpace {
		a.logger.Warn("min_free_space of this config ignored: the store is already open with another; it applies once Caddy restarts",
			zap.String("store", a.name), zap.Int64("in_use", a.handle.minFree), zap.Int64("configured", a.MinFreeSpace))
	}
	a.handle.join(a)
	a.noteRemovedAccounts(a.ctx)
	a.inflight = make(chan struct{}, a.Replay.Concurrency)
	a.slotFreed = make(chan struct{}, 1)
	a.slotMu = new(sync.Mutex)
	a.loopCtx, a.loopCancel = context.WithCancel(a.ctx)
	a.loopDone = make(chan struct{})
	a.pollDone = make(chan struct{})
	a.metrics.storeAvailable.Set(boolGauge(a.handle.store.Available()))
	a.startPauses() // before the loops: nothing held is claimed
	go a.replayLoop()
	go a.pollLoop()
	// open: how long this Start took to open the store (or to take the
	// running config's handle, when shared is true), in seconds.
	a.logger.Info("pingback store ready", zap.String("store", a.name), zap.Duration("open", opened), zap.Bool("shared", loaded))
	a.logPlan()
	return nil
}

// Stop stops this config's loops and hands loop ownership to a config that
// is still running; it does not wait for forwards. Forwards of this config
// still running cutAfter later are cut and recorded as interrupted, so the
// new config replays them at once and an app that hangs never holds a
// reload. The store stays open until Cleanup (and until those outcomes are
// recorded) so that requests finishing during the HTTP server's grace
// period are still stored.
func (a *App) Stop() error {
	if a.handle == nil {
		return nil
	}
	close(a.stop)
	a.loopCancel()
	a.handle.leave(a)
	<-a.loopDone
	<-a.pollDone
	<-a.pause.done
	a.beginCut()
	a.handle.wake() // the new owner's loop takes over at once
	return nil
}

// Cleanup releases this config's reference to the store; the last
// reference closes the database.
func (a *App) Cleanup() error {
	if a.countsHeld {
		a.countsHeld = false
		_, _ = submissionPool.Delete(a.dir) // a no-op Destruct: no error
	}
	a.releaseAdminState()
	a.stopEvents()
	if !a.held {
		return nil // never opened (validation run, or Start failed)
	}
	a.held = false
	deleted, err := stores.Delete(a.dir)
	if deleted {
		a.logger.Info("pingback store closed", zap.String("store", a.name))
	}
	return err
}

// logPlan writes the start-up line that says what the plugin will do with
// this config: the store and its location, the providers it polls (those
// with an api_key) and their accounts ("<provider> <account id> <api_key
// entry>", the entry's placeholder or its position, never the key), and
// the replay and poll settings in force.
func (a *App) logPlan() {
	var polled, unpolled, accounts []string
	for name, pc := range a.Providers {
		if pc != nil && len(pc.accounts) > 0 {
			polled = append(polled, name)
			for _, acc := range pc.accounts {
				accounts = append(accounts, name+" "+acc.id+" "+acc.configured)
			}
		} else {
			unpolled = append(unpolled, name)
		}
	}
	slices.Sort(polled)
	slices.Sort(unpolled)
	slices.Sort(accounts)
	kind := "badger"
	if _, ok := a.storeMod.(*PostgresStore); ok {
		kind = "postgres"
	}
	r, p := a.Replay, a.Poll
	a.logger.Info("pingback plugin started",
		zap.String("store", kind), zap.String("location", a.name),
		zap.Strings("providers_polled", polled), zap.Strings("providers_not_polled_no_api_key", unpolled),
		zap.Strings("accounts", accounts),
		zap.String("replay_backoff", time.Duration(r.BackoffMin).String()+" to "+time.Duration(r.BackoffMax).String()),
		zap.Int("replay_max_attempts", r.MaxAttempts), zap.Int("replay_concurrency", r.Concurrency),
		zap.Duration("forward_timeout", time.Duration(r.ForwardTimeout)),
		zap.String("poll", afterText(p)), zap.Duration("poll_interval", time.Duration(p.Interval)),
		zap.Duration("poll_give_up", time.Duration(p.GiveUp)), zap.Int("poll_batch", p.Batch), zap.Float64("poll_rate", p.Rate))
}

// watchStopping subscribes the app to its config's "stopping" event
// (loading the config's events app, as the http app does anyway).
func (a *App) watchStopping(ctx caddy.Context) {
	v, err := ctx.App("events")
	if err != nil {
		a.logger.Warn("no events app: forwards are cut only from this app's Stop", zap.Error(err))
		return
	}
	ev, ok := v.(*caddyevents.App)
	if !ok {
		return
	}
	a.eventsApp = ev
	if err := ev.On("stopping", stoppingHandler{a}); err != nil {
		a.logger.Warn("cannot watch the stopping event: forwards are cut only from this app's Stop", zap.Error(err))
	}
}

// beginCut starts the countdown to cutting this config's forwards and
// stops the replay loop from starting new ones; later calls do nothing.
func (a *App) beginCut() {
	a.cutOnce.Do(func() {
		close(a.stopping)
		time.AfterFunc(cutAfter, a.cutCancel)
	})
}

// isStopping reports whether the countdown to the cut has begun.
func (a *App) isStopping() bool {
	select {
	case <-a.stopping:
		return true
	default:
		return false
	}
}

// stoppingHandler receives the "stopping" event.
type stoppingHandler struct{ a *App }

// Handle implements caddyevents.Handler.
func (h stoppingHandler) Handle(context.Context, caddy.Event) error {
	h.a.beginCut()
	return nil
}

// Interface guards
var _ caddyevents.Handler = stoppingHandler{}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
	_ caddy.Destructor   = (*storeHandle)(nil)
)
