package pingback

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

func init() {
	caddy.RegisterModule(BadgerStore{})
	caddy.RegisterModule(PostgresStore{})
}

// StoreModule is a guest module of the pingback app's `store` field
// (namespace pingback.stores): it names where results live and opens the
// store there. The app opens it in Start, never while provisioning, so
// `caddy validate` touches no storage.
type StoreModule interface {
	// StoreLocation identifies the data: two configs with the same
	// location share one open store per process (caddy.UsagePool).
	StoreLocation() string
	// StoreName is how status and logs show the store (a directory, or
	// host:port/database): never a password.
	StoreName() string
	// OpenStore opens the store. legacyAccounts maps a provider to the
	// account id given to the tasks stored before tasks had accounts
	// (badgerstore.Options.LegacyAccounts, pgstore.Options.
	// LegacyAccounts).
	OpenStore(logger *zap.Logger, minFreeSpace int64, legacyAccounts map[string]string) (store.Store, error)
}

// BadgerStore is the embedded single-node store (module
// pingback.stores.badger): one Badger database in a directory, synced on
// every commit. The app's storage_dir is a shorthand for it.
type BadgerStore struct {
	// Directory of the database. Default: the "pingback" folder in
	// Caddy's data directory (caddy.AppDataDir()). Placeholders are
	// resolved at provision.
	Dir string `json:"dir,omitempty"`

	dir string // absolute, cleaned: the location
}

// CaddyModule returns the Caddy module information.
func (BadgerStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "pingback.stores.badger", New: func() caddy.Module { return new(BadgerStore) }}
}

// Provision resolves the directory.
func (b *BadgerStore) Provision(caddy.Context) error {
	dir := b.Dir
	if dir == "" {
		dir = filepath.Join(caddy.AppDataDir(), "pingback")
	}
	dir = caddy.NewReplacer().ReplaceAll(dir, "")
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("storage directory %q: %w", dir, err)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	b.dir = filepath.Clean(abs)
	return nil
}

// StoreLocation implements StoreModule.
func (b *BadgerStore) StoreLocation() string { return b.dir }

// StoreName implements StoreModule.
func (b *BadgerStore) StoreName() string { return b.dir }

// OpenStore implements StoreModule.
func (b *BadgerStore) OpenStore(logger *zap.Logger, minFree int64, legacyAccounts map[string]string) (store.Store, error) {
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating storage_dir %s: %w", b.dir, err)
	}
	m, _ := registerMetrics(nil) // the process's metrics, whose counters every Badger store counts into
	opts := badgerstore.Options{Dir: b.dir, Logger: logger.Named("badger"), MinFreeSpace: minFree, LegacyAccounts: legacyAccounts, Counters: m.storeCounters}
	return badgerstore.Open(opts)
}

// UnmarshalCaddyfile parses `store badger { dir <path> }`.
func (b *BadgerStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return eachSubdirective(d, "store badger ", nil, func(name string) error {
		switch name {
		case "dir":
			return oneArg(d, &b.Dir)
		default:
			return d.Errf("unrecognized store badger option '%s'", name)
		}
	})
}

// PostgresStore is the store shared by several Caddy instances (module
// pingback.stores.postgres): every instance with the same DSN (and schema)
// shares results, deduplication, replays and polling. See
// docs/storage.md, "Several instances (PostgreSQL)".
type PostgresStore struct {
	// The database, as a libpq connection string or postgres:// URL
	// (pgx syntax; pgxpool's pool_max_conns and friends are accepted,
	// default pool 8 connections). Placeholders such as {env.PINGBACK_DSN}
	// are resolved at provision. Required. Never logged: logs and status
	// name the store as host:port/database. Works directly and behind a
	// pooler (PgBouncer in session or transaction pooling): unless the DSN
	// sets pgx's default_query_exec_mode, statements run unnamed ("exec");
	// default_query_exec_mode=cache_statement is for a connection of the
	// store's own (direct or session-pooled). See docs/storage.md, "Behind
	// a pooler".
	DSN string `json:"dsn,omitempty"`

	// The schema that holds the store's tables; created if it does not
	// exist (which needs CREATE on the database; a role that owns an
	// existing schema needs nothing more) and migrated at start. Default:
	// pingback.
	Schema string `json:"schema,omitempty"`

	// How long a forward's lease lasts unless renewed (every third of it
	// while the forward runs): within this time after an instance dies,
	// another takes over its forwards. Default: 15s; at most 30s.
	LeaseTerm caddy.Duration `json:"lease_term,omitempty"`

	dsn      string
	location string // host:port/database
}

// CaddyModule returns the Caddy module information.
func (PostgresStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "pingback.stores.postgres", New: func() caddy.Module { return new(PostgresStore) }}
}

// Provision resolves the DSN and checks its syntax; it does not connect.
func (p *PostgresStore) Provision(caddy.Context) error {
	p.dsn = caddy.NewReplacer().ReplaceAll(p.DSN, "")
	if p.dsn == "" {
		return fmt.Errorf("store postgres: dsn is required (it resolved to nothing from %q)", p.DSN)
	}
	loc, err := pgstore.Location(p.dsn)
	if err != nil {
		return fmt.Errorf("store postgres: %w", err)
	}
	p.location = loc
	if p.Schema == "" {
		p.Schema = pgstore.DefaultSchema
	}
	return nil
}

// Validate checks the lease term.
func (p *PostgresStore) Validate() error {
	if lt := time.Duration(p.LeaseTerm); lt < 0 || lt > 30*time.Second || (lt != 0 && lt < 3*time.Second) {
		return fmt.Errorf("store postgres: lease_term must be within [3s, 30s], got %s", lt)
	}
	return nil
}

// StoreLocation implements StoreModule.
func (p *PostgresStore) StoreLocation() string {
	return "postgres " + p.location + " schema " + p.Schema
}

// StoreName implements StoreModule.
func (p *PostgresStore) StoreName() string { return p.location }

// OpenStore implements StoreModule: the database is retried for 10 s
// while unreachable; the error then names host and port.
func (p *PostgresStore) OpenStore(logger *zap.Logger, _ int64, legacyAccounts map[string]string) (store.Store, error) {
	return pgstore.Open(pgstore.Options{
		DSN:            p.dsn,
		Schema:         p.Schema,
		LeaseTerm:      time.Duration(p.LeaseTerm),
		Logger:         logger.Named("postgres"),
		LegacyAccounts: legacyAccounts,
	})
}

// UnmarshalCaddyfile parses `store postgres { dsn <dsn>; schema <name>;
// lease_term <duration> }`.
func (p *PostgresStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return eachSubdirective(d, "store postgres ", nil, func(name string) error {
		switch name {
		case "dsn":
			return oneArg(d, &p.DSN)
		case "schema":
			return oneArg(d, &p.Schema)
		case "lease_term":
			return durationArg(d, &p.LeaseTerm)
		default:
			return d.Errf("unrecognized store postgres option '%s'", name)
		}
	})
}

// store returns the open store, waiting up to wait for Start to open it
// (apps start in random order, so the HTTP server may serve a request before
// this app's Start has run). It returns nil if the store is not available.
func (a *App) store(wait time.Duration) store.Store {
	st, _ := a.storeWithin(wait)
	return st
}

// storeWithin is store that also tells why there is none: opening is true
// when wait ran out while Start was still opening the store, false when
// Start has returned without one (the open failed).
func (a *App) storeWithin(wait time.Duration) (st store.Store, opening bool) {
	select {
	case <-a.ready:
	default:
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-a.ready:
		case <-t.C:
			return nil, true
		}
	}
	if h := a.handle; h != nil {
		return h.store, false
	}
	return nil, false
}

// readyHandle returns the store handle once Start has run, without
// waiting; nil before, or if the store did not open.
func (a *App) readyHandle() *storeHandle {
	select {
	case <-a.ready:
		return a.handle
	default:
		return nil
	}
}

// stores holds one *storeHandle per absolute storage directory.
var stores = caddy.NewUsagePool()

// storeHandle is the process-wide, pooled part of the app: the open store
// and the list of started apps using it. Only the most recently started of
// them runs the replay loop, so the loop runs once per store even while an
// old and a new config overlap during a reload.
type storeHandle struct {
	store   store.Store
	minFree int64         // the min_free_space it was opened with
	kick    chan struct{} // wakes the replay loop: a slot is free, or a result is queued

	// Throttled logs, shared by every config on this store and flushed by
	// the loop owner's housekeeping.
	failures        *throttledLog // failed forwards, by route
	storeErrors     *throttledLog // results not stored, by provider
	quarantined     *throttledLog // pingbacks quarantined (or refused: quarantine full), by provider
	confirmsDropped *throttledLog // confirmations dropped (queue full), by provider
	expired         *throttledLog // results expired for max_age, by provider

	mu        sync.Mutex
	apps      []*App                          // started apps, oldest first; the last one owns the loops
	providers map[string]*providerState       // the poller's state per provider
	accounts  map[store.Account]*accountState // the poller's state per account
	// unpollableLogged is when the unpollable warning was last logged,
	// per account (warnUnpollable).
	unpollableLogged map[store.Account]time.Time
	closing          bool // Destruct began: no new outcomes
	// outcomesWaiting counts outcomes waiting for an unavailable store to
	// take them; the replay loop claims nothing meanwhile.
	outcomesWaiting atomic.Int64
	outcomes        sync.WaitGroup // forwards in flight and outcomes being recorded: Destruct waits for them

	// delays writes observed delays to a shared store (delayWriterOf).
	delaysOnce sync.Once
	delays     *delayWriter

	// confirms bounds the confirmations in flight ([App.confirmLater]).
	confirms confirmQueue

	// flows is the replays' flow control per route ([routeFlows]).
	flows routeFlows

	// loops are the times the loops last ran a round on this store, in
	// this process (GET /pingback/status).
	loops loopTimes
	// ages are the store's ages last read (App.currentAges).
	ages agesCache
	// quarantine is the bytes quarantined per provider, as this process
	// knows them (App.quarantineUsed).
	quarantine quarantineUsage

	// history counts this process's figures of the minute and writes
	// them once a minute (App.historyRound) and at Destruct.
	history *historyRecorder
	// health is every route's delivery health ([routeHealth]), events
	// what the emitted events remember ([eventState]).
	health routeHealth
	events eventState
	// pauses are the pauses of deliveries as last read ([App.refreshPauses]).
	pauses pauseView
}

// logStoreError reports whether a result of provider that was not
// stored may be logged now; the others are counted in the store's
// summary line each minute.
func (a *App) logStoreError(provider string) bool {
	return a.handle.storeErrors.allow(provider)
}

// openStoreHandle opens the store of mod; legacy is provider → the
// account id given to tasks stored before tasks had accounts (the format
// or schema upgrade applies it once).
func openStoreHandle(mod StoreModule, minFree int64, logger *zap.Logger, legacy map[string]string) (*storeHandle, error) {
	s, err := mod.OpenStore(logger, minFree, legacy)
	if err != nil {
		return nil, err
	}
	return &storeHandle{
		store:           s,
		minFree:         minFree,
		kick:            make(chan struct{}, 1),
		failures:        newThrottledLog(failureLinesPerWindow, 100, "forwards to this route failed in the last minute"),
		storeErrors:     newThrottledLog(1, 100, "results NOT stored in the last minute (forwarded without durability, or answered 503 when they could not be verified)"),
		quarantined:     newThrottledLog(20, 100, "pingbacks quarantined in the last minute"),
		confirmsDropped: newThrottledLog(20, 100, "confirmations dropped in the last minute (queue full)"),
		history:         newHistoryRecorder(s, logger),
		expired:         newExpiredLog(),
	}, nil
}

// failureLinesPerWindow is how many failed forwards a minute get a log
// line of their own; the rest are only counted in the minute's summary.
const failureLinesPerWindow = 20

// wake makes the replay loop look for due records now.
func (h *storeHandle) wake() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// track counts an outcome about to be recorded in the background; it
// returns false once the store is being closed (then nothing is recorded,
// and the lease lapses with the store).
func (h *storeHandle) track() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return false
	}
	h.outcomes.Add(1)
	return true
}

func (h *storeHandle) untrack() { h.outcomes.Done() }

// isClosing reports whether Destruct began.
func (h *storeHandle) isClosing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closing
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

// Destruct closes the store once the outcomes being recorded are; called
// by the pool when its last user is gone.
func (h *storeHandle) Destruct() error {
	h.mu.Lock()
	h.closing = true
	h.mu.Unlock()
	h.outcomes.Wait()
	h.history.flushAll()
	h.stopDelays()
	return h.store.Close()
}

// readyStore returns the open store once Start has run, without waiting;
// nil before, or if the store did not open.
func (a *App) readyStore() store.Store {
	if h := a.readyHandle(); h != nil {
		return h.store
	}
	return nil
}

// Interface guards
var (
	_ StoreModule           = (*BadgerStore)(nil)
	_ StoreModule           = (*PostgresStore)(nil)
	_ caddy.Provisioner     = (*BadgerStore)(nil)
	_ caddy.Provisioner     = (*PostgresStore)(nil)
	_ caddy.Validator       = (*PostgresStore)(nil)
	_ caddyfile.Unmarshaler = (*BadgerStore)(nil)
	_ caddyfile.Unmarshaler = (*PostgresStore)(nil)
)

// provisionStore loads the app's store module: the `store` guest module,
// or a Badger store in storage_dir (its shorthand; both together are an
// error, as is storage_dir with a PostgreSQL store).
func (a *App) provisionStore(ctx caddy.Context) error {
	if a.StoreRaw != nil {
		if a.StorageDir != "" {
			return errors.New("storage_dir and store are both set: storage_dir is the Badger store's directory; set one (for PostgreSQL, remove storage_dir; for Badger, use store badger { dir ... } or storage_dir alone)")
		}
		v, err := ctx.LoadModule(a, "StoreRaw")
		if err != nil {
			return fmt.Errorf("loading the store module: %w", err)
		}
		mod, ok := v.(StoreModule)
		if !ok {
			return fmt.Errorf("module %T is not a pingback store", v)
		}
		a.storeMod = mod
	} else {
		b := &BadgerStore{Dir: a.StorageDir}
		if err := b.Provision(ctx); err != nil {
			return fmt.Errorf("storage_dir: %w", err)
		}
		a.storeMod = b
	}
	a.dir = a.storeMod.StoreLocation()
	a.name = a.storeMod.StoreName()
	return nil
}
