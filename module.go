// Package pingback is a Caddy v2 plugin that makes captcha-solver pingbacks
// (CaptchaAI, 2captcha, rucaptcha) reliable in front of an unchanged app:
// the pingback handler stores every result durably before answering 200,
// deduplicates re-deliveries and forwards to the app through the next
// handler (normally reverse_proxy); failed forwards stay in a dead-letter
// queue that the pingback app replays with backoff.
package pingback

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	caddy.RegisterModule(App{})
}

// Defaults of the app's configuration.
const (
	DefaultRetention   = 24 * time.Hour
	DefaultBackoffMin  = 5 * time.Second
	DefaultBackoffMax  = 10 * time.Minute
	DefaultMaxAttempts = 20
	DefaultStuckAfter  = time.Minute
	DefaultConcurrency = 4
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

	// How long a result is kept after it was received, whatever its state
	// (parked entries included). Default: 24h.
	Retention caddy.Duration `json:"retention,omitempty"`

	// How failed forwards are replayed.
	Replay *ReplayConfig `json:"replay,omitempty"`

	// The providers' API settings for the fallback poller, keyed by
	// provider name (captchaai, 2captcha, rucaptcha).
	Providers map[string]*ProviderConfig `json:"providers,omitempty"`

	// How tracked tasks whose pingback is overdue are polled.
	Poll *PollConfig `json:"poll,omitempty"`

	ctx    caddy.Context
	logger *zap.Logger
	dir    string // absolute, cleaned StorageDir: the pool key

	handle *storeHandle  // set by Start once the store is open; never unset
	ready  chan struct{} // closed when Start has finished, opened or not
	held   bool          // this config holds a pool reference (Cleanup releases it)

	stop       chan struct{}
	loopCtx    context.Context // ends at Stop: the poller's waits for its rate limiter
	loopCancel context.CancelFunc
	loopDone   chan struct{}   // closed when the replay loop has returned
	pollDone   chan struct{}   // closed when the poll loop has returned
	deliveries *sync.WaitGroup // polled results being delivered
	// inflight bounds the forwards the loops have in flight (replays and
	// polled results together) to Replay.Concurrency.
	inflight   chan struct{}
	httpClient *http.Client // for res.php
	probes     *sync.Map    // "<method> <pingback URL>" → probe result (error or nil)
	metrics    *metrics

	// now and jitter are the clock and random source of the replay loop;
	// tests replace them.
	now    func() time.Time
	jitter func(n int64) int64
}

// ReplayConfig configures the replay loop of the dead-letter queue.
type ReplayConfig struct {
	// Delay before the first retry; each retry doubles the cap, and the
	// actual delay is drawn uniformly between BackoffMin and the cap
	// (exponential backoff with full jitter). Default: 5s.
	BackoffMin caddy.Duration `json:"backoff_min,omitempty"`
	// Largest delay between two attempts. Default: 10m.
	BackoffMax caddy.Duration `json:"backoff_max,omitempty"`
	// Forwards attempted (the live one included) before a retryable
	// failure is parked: kept and visible but no longer retried.
	// Default: 20.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// A record still "forwarding" this long after its forward started
	// (for example because Caddy crashed mid-forward) is replayed. It is
	// also the upper bound of one forward. Default: 1m.
	StuckAfter caddy.Duration `json:"stuck_after,omitempty"`
	// Replays in flight at most, so a recovering app is not stampeded.
	// Default: 4.
	Concurrency int `json:"concurrency,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
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
	a.deliveries = new(sync.WaitGroup)
	a.probes = new(sync.Map)
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
	if r.StuckAfter == 0 {
		r.StuckAfter = caddy.Duration(DefaultStuckAfter)
	}
	if r.Concurrency == 0 {
		r.Concurrency = DefaultConcurrency
	}

	dir := a.StorageDir
	if dir == "" {
		dir = filepath.Join(caddy.AppDataDir(), "pingback")
	}
	dir = caddy.NewReplacer().ReplaceAll(dir, "")
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("storage_dir %q: %w", dir, err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	a.dir = filepath.Clean(abs)

	if err := a.provisionPolling(); err != nil {
		return err
	}

	m, err := registerMetrics(ctx.GetMetricsRegistry())
	if err != nil {
		return err
	}
	a.metrics = m
	return nil
}

// Validate checks the configuration.
func (a *App) Validate() error {
	r := a.Replay
	switch {
	case a.Retention < 0:
		return fmt.Errorf("retention must be positive, got %s", time.Duration(a.Retention))
	case r.BackoffMin < 0 || r.BackoffMax < r.BackoffMin:
		return fmt.Errorf("replay backoff: need 0 < min <= max, got %s and %s", time.Duration(r.BackoffMin), time.Duration(r.BackoffMax))
	case r.MaxAttempts < 1:
		return fmt.Errorf("replay max_attempts must be at least 1, got %d", r.MaxAttempts)
	case r.StuckAfter < 0:
		return fmt.Errorf("replay stuck_after must be positive, got %s", time.Duration(r.StuckAfter))
	case r.Concurrency < 1:
		return fmt.Errorf("replay concurrency must be at least 1, got %d", r.Concurrency)
	}
	return nil
}

// Start opens the store (or takes another reference to the one a running
// config already opened on the same directory) and starts the replay loop.
// A store that cannot be opened stops Caddy: the plugin never runs without
// persistence.
func (a *App) Start() error {
	defer close(a.ready)
	v, _, err := stores.LoadOrNew(a.dir, func() (caddy.Destructor, error) {
		return openStoreHandle(a.dir, a.logger)
	})
	if err != nil {
		return fmt.Errorf("pingback storage: %w", err)
	}
	a.held = true
	a.handle = v.(*storeHandle)
	a.handle.join(a)
	a.inflight = make(chan struct{}, a.Replay.Concurrency)
	a.loopCtx, a.loopCancel = context.WithCancel(a.ctx)
	a.loopDone = make(chan struct{})
	a.pollDone = make(chan struct{})
	go a.replayLoop()
	go a.pollLoop()
	a.logger.Info("pingback store ready", zap.String("storage_dir", a.dir))
	return nil
}

// Stop stops this config's replay loop and hands loop ownership to a
// config that is still running. The store stays open until Cleanup so that
// requests finishing during the HTTP server's grace period are still stored.
func (a *App) Stop() error {
	if a.handle == nil {
		return nil
	}
	close(a.stop)
	a.loopCancel()
	a.handle.leave(a)
	<-a.loopDone
	<-a.pollDone
	return nil
}

// Cleanup releases this config's reference to the store; the last
// reference closes the database.
func (a *App) Cleanup() error {
	if !a.held {
		return nil // never opened (validation run, or Start failed)
	}
	a.held = false
	deleted, err := stores.Delete(a.dir)
	if deleted {
		a.logger.Info("pingback store closed", zap.String("storage_dir", a.dir))
	}
	return err
}

// store returns the open store, waiting up to wait for Start to open it
// (apps start in random order, so the HTTP server may serve a request before
// this app's Start has run). It returns nil if the store is not available.
func (a *App) store(wait time.Duration) store.Store {
	select {
	case <-a.ready:
	default:
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-a.ready:
		case <-t.C:
			return nil
		}
	}
	if h := a.handle; h != nil {
		return h.store
	}
	return nil
}

// stores holds one *storeHandle per absolute storage directory.
var stores = caddy.NewUsagePool()

// storeHandle is the process-wide, pooled part of the app: the open store
// and the list of started apps using it. Only the most recently started of
// them runs the replay loop, so the loop runs once per store even while an
// old and a new config overlap during a reload.
type storeHandle struct {
	store store.Store

	mu        sync.Mutex
	apps      []*App                    // started apps, oldest first; the last one owns the loops
	providers map[string]*providerState // the poller's state per provider
	outcomes  sync.WaitGroup            // live forwards' outcomes being recorded
}

func openStoreHandle(dir string, logger *zap.Logger) (*storeHandle, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating storage_dir %s: %w", dir, err)
	}
	s, err := store.OpenBadger(store.BadgerOptions{
		Dir:    dir,
		Logger: logger.Named("badger"),
	})
	if err != nil {
		return nil, err
	}
	return &storeHandle{store: s}, nil
}

func (h *storeHandle) join(a *App) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.apps = append(h.apps, a)
}

func (h *storeHandle) leave(a *App) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, x := range h.apps {
		if x == a {
			h.apps = append(h.apps[:i], h.apps[i+1:]...)
			return
		}
	}
}

// owns reports whether a runs the loops of this store.
func (h *storeHandle) owns(a *App) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.apps) > 0 && h.apps[len(h.apps)-1] == a
}

// Destruct closes the store; called by the pool when its last user is gone.
func (h *storeHandle) Destruct() error {
	h.outcomes.Wait()
	return h.store.Close()
}

// Interface guards
var (
	_ caddy.App          = (*App)(nil)
	_ caddy.Provisioner  = (*App)(nil)
	_ caddy.Validator    = (*App)(nil)
	_ caddy.CleanerUpper = (*App)(nil)
	_ caddy.Destructor   = (*storeHandle)(nil)
)
