package main

import (
	"fmt"
	"os"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
)

func init() {
	caddy.RegisterModule(SyncWritesStore{})
}

// SyncWritesStore is the store module pingback.stores.badger_syncwrites:
// the Badger store of pingback.stores.badger (the same fields: dir, its
// default and placeholders), opened with badgerstore.Options.JournalSize
// -1, so that every commit is synced by Badger's SyncWrites (two msyncs)
// instead of one fdatasync of the journal. Only for measuring the two.
//
// It differs from pingback.stores.badger in what the measurement leaves
// aside: its commits, syncs and checkpoints are counted in counters of its
// own, not in the process's /metrics, and /pingback/status gives no free
// space for it.
type SyncWritesStore struct {
	pingback.BadgerStore
}

// CaddyModule returns the Caddy module information.
func (SyncWritesStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "pingback.stores.badger_syncwrites", New: func() caddy.Module { return new(SyncWritesStore) }}
}

// OpenStore implements pingback.StoreModule: the directory (made if
// missing, mode 0700) opened by badgerstore.Open without the journal.
func (s *SyncWritesStore) OpenStore(logger *zap.Logger, minFree int64, legacyAccounts map[string]string) (store.Store, error) {
	dir := s.StoreLocation()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the store directory %s: %w", dir, err)
	}
	b, err := badgerstore.Open(badgerstore.Options{
		Dir:            dir,
		Logger:         logger.Named("badger"),
		MinFreeSpace:   minFree,
		LegacyAccounts: legacyAccounts,
		JournalSize:    -1,
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

// Interface guards
var (
	_ pingback.StoreModule = (*SyncWritesStore)(nil)
	_ caddy.Provisioner    = (*SyncWritesStore)(nil)
)
