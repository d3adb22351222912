package pingback

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
)

func init() {
	caddy.RegisterModule(faultyStore{})
}

// storeFaults is what a test injects into the Badger store a config opens
// through the test-only store module pingback.stores.test_faults. A nil
// field injects nothing.
type storeFaults struct {
	// beforeOpen runs in Start just before the store is opened (not when
	// a running config already has it open), in Caddy's config load, with
	// the context of the config that opens it: tests hold the open with
	// it to keep the start-up window open as long as they need.
	beforeOpen func(caddy.Context)
	// options adjusts the store's Badger options: commit faults and
	// delays.
	options func(*badgerstore.Options)
	// wrap wraps the open store: the app uses what it returns, from the
	// start, on every path (handlers and loops alike).
	wrap func(store.Store) store.Store
}

// testFaults are the registered storeFaults by name (faultyStore.Name).
var testFaults sync.Map

// faultsSeq makes faults names unique.
var faultsSeq atomic.Int64

// registerFaults registers f for the test and returns its name.
func registerFaults(t *testing.T, f *storeFaults) string {
	t.Helper()
	name := fmt.Sprintf("%s#%d", t.Name(), faultsSeq.Add(1))
	testFaults.Store(name, f)
	t.Cleanup(func() { testFaults.Delete(name) })
	return name
}

// faultyStore is the test-only store module pingback.stores.test_faults:
// the Badger store in Dir (resolved as BadgerStore resolves it, so the
// two modules name one directory alike and share its open store across a
// reload), opened with its self-checks on (badgerstore.Options.SelfCheck)
// and the faults registered under Name (none if Name is empty).
type faultyStore struct {
	Name string `json:"name,omitempty"`
	Dir  string `json:"dir"`

	ctx    caddy.Context
	badger BadgerStore // the directory, resolved
	faults *storeFaults
}

// CaddyModule returns the Caddy module information.
func (faultyStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "pingback.stores.test_faults", New: func() caddy.Module { return new(faultyStore) }}
}

// Provision resolves Dir and finds the faults registered under Name.
func (f *faultyStore) Provision(ctx caddy.Context) error {
	f.ctx, f.faults = ctx, &storeFaults{}
	f.badger = BadgerStore{Dir: f.Dir}
	if err := f.badger.Provision(ctx); err != nil {
		return fmt.Errorf("storage_dir: %w", err)
	}
	if f.Name == "" {
		return nil
	}
	v, ok := testFaults.Load(f.Name)
	if !ok {
		return fmt.Errorf("no store faults registered as %q", f.Name)
	}
	f.faults = v.(*storeFaults)
	return nil
}

// StoreLocation implements StoreModule.
func (f *faultyStore) StoreLocation() string { return f.badger.StoreLocation() }

// StoreName implements StoreModule.
func (f *faultyStore) StoreName() string { return f.badger.StoreName() }

// OpenStore implements StoreModule: BadgerStore.OpenStore with the
// self-checks on and the faults.
func (f *faultyStore) OpenStore(logger *zap.Logger, minFree int64, legacyAccounts map[string]string) (store.Store, error) {
	if f.faults.beforeOpen != nil {
		f.faults.beforeOpen(f.ctx)
	}
	dir := f.StoreLocation()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating storage_dir %s: %w", dir, err)
	}
	m, _ := registerMetrics(nil)
	opts := badgerstore.Options{Dir: dir, Logger: logger.Named("badger"), MinFreeSpace: minFree, LegacyAccounts: legacyAccounts, Counters: m.storeCounters, SelfCheck: true}
	if f.faults.options != nil {
		f.faults.options(&opts)
	}
	st, err := badgerstore.Open(opts)
	if err != nil || f.faults.wrap == nil {
		return st, err
	}
	return f.faults.wrap(st), nil
}

// withStoreFaults returns cfg, a JSON config whose pingback app has a
// storage_dir, with that directory's store opened through
// pingback.stores.test_faults with f.
func withStoreFaults(t *testing.T, cfg []byte, f *storeFaults) []byte {
	t.Helper()
	out, ok := swapStore(t, cfg, registerFaults(t, f))
	if !ok {
		t.Fatalf("the config has no pingback storage_dir to open with faults: %s", cfg)
	}
	return out
}

// selfChecked returns cfg, a JSON config, with its pingback app's
// storage_dir opened through pingback.stores.test_faults with no faults:
// the production Badger store with its self-checks on. A config without
// a pingback app, without a storage_dir or with a store module is
// returned as it is.
func selfChecked(t *testing.T, cfg []byte) []byte {
	t.Helper()
	if out, ok := swapStore(t, cfg, ""); ok {
		return out
	}
	return cfg
}

// swapStore returns cfg with its pingback app's storage_dir replaced by
// the store module pingback.stores.test_faults on that directory with the
// faults registered as name, and whether cfg had a storage_dir to replace
// (and no store module beside it).
func swapStore(t *testing.T, cfg []byte, name string) ([]byte, bool) {
	t.Helper()
	var whole map[string]any
	if err := json.Unmarshal(cfg, &whole); err != nil {
		t.Fatal(err)
	}
	apps, _ := whole["apps"].(map[string]any)
	app, _ := apps["pingback"].(map[string]any)
	dir, _ := app["storage_dir"].(string)
	if _, set := app["store"]; dir == "" || set {
		return cfg, false
	}
	delete(app, "storage_dir")
	app["store"] = map[string]any{"module": "test_faults", "name": name, "dir": dir}
	out, err := json.Marshal(whole)
	if err != nil {
		t.Fatal(err)
	}
	return out, true
}

// startCaddyFaults is startCaddy with the store opened with f.
func startCaddyFaults(t *testing.T, f *storeFaults, pingbackGlobal, sites string) string {
	t.Helper()
	dir := t.TempDir() // registered first: removed after the unload below
	cfg := withStoreFaults(t, adaptCaddyfile(t, caddyfileFor("storage_dir "+dir+"\n"+pingbackGlobal, sites)), f)
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading config: %v", err)
	}
	t.Cleanup(func() { unloadCaddy(t) })
	return dir
}

// startCaddyWith is startCaddy with the store opened with Badger options
// adjusted by fn.
func startCaddyWith(t *testing.T, fn func(*badgerstore.Options), pingbackGlobal, sites string) string {
	t.Helper()
	return startCaddyFaults(t, &storeFaults{options: fn}, pingbackGlobal, sites)
}

// startCaddyWrapped is startCaddy with the store wrapped by wrap.
func startCaddyWrapped(t *testing.T, wrap func(store.Store) store.Store, pingbackGlobal, sites string) string {
	t.Helper()
	return startCaddyFaults(t, &storeFaults{wrap: wrap}, pingbackGlobal, sites)
}

// Interface guards
var (
	_ StoreModule       = (*faultyStore)(nil)
	_ caddy.Provisioner = (*faultyStore)(nil)
)
