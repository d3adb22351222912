package pingback

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
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
	// OpenStore opens the store.
	OpenStore(logger *zap.Logger, minFreeSpace int64) (store.Store, error)
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
func (b *BadgerStore) OpenStore(logger *zap.Logger, minFree int64) (store.Store, error) {
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating storage_dir %s: %w", b.dir, err)
	}
	opts := store.BadgerOptions{Dir: b.dir, Logger: logger.Named("badger"), MinFreeSpace: minFree}
	if testStoreOptions != nil {
		testStoreOptions(&opts)
	}
	return store.OpenBadger(opts)
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
// shares results, deduplication, replays and polling. See README.md,
// "Several instances".
type PostgresStore struct {
	// The database, as a libpq connection string or postgres:// URL
	// (pgx syntax; pgxpool's pool_max_conns and friends are accepted,
	// default pool 8 connections). Placeholders such as {env.PINGBACK_DSN}
	// are resolved at provision. Required. Never logged: logs and status
	// name the store as host:port/database.
	DSN string `json:"dsn,omitempty"`

	// The schema that holds the store's tables; created and migrated at
	// start. Default: pingback.
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
	loc, err := store.PostgresLocation(p.dsn)
	if err != nil {
		return fmt.Errorf("store postgres: %w", err)
	}
	p.location = loc
	if p.Schema == "" {
		p.Schema = store.DefaultPostgresSchema
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
func (p *PostgresStore) OpenStore(logger *zap.Logger, _ int64) (store.Store, error) {
	return store.OpenPostgres(store.PostgresOptions{
		DSN:       p.dsn,
		Schema:    p.Schema,
		LeaseTerm: time.Duration(p.LeaseTerm),
		Logger:    logger.Named("postgres"),
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
