package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
)

// TestSyncWritesStoreOpensWithoutJournal: the module a JSON config names
// as badger_syncwrites, with the dir field of the Badger store, opens a
// store in that directory that writes no journal, and what it stored is
// there for the journaled store opened on the directory afterwards.
func TestSyncWritesStoreOpensWithoutJournal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	info, err := caddy.GetModule("pingback.stores.badger_syncwrites")
	if err != nil {
		t.Fatal(err)
	}
	mod := info.New()
	cfg, err := json.Marshal(map[string]string{"dir": dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(cfg, mod); err != nil {
		t.Fatal(err)
	}
	if err := mod.(caddy.Provisioner).Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	sm := mod.(pingback.StoreModule)
	if got, _ := filepath.EvalSymlinks(filepath.Dir(dir)); sm.StoreLocation() != filepath.Join(got, "store") {
		t.Fatalf("location %q, want the directory %q", sm.StoreLocation(), dir)
	}

	st, err := sm.OpenStore(zap.NewNop(), -1, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	rec := &store.Record{
		Provider: "2captcha", ID: "1", Code: "ready", Source: store.SourceCallback, ReceivedAt: now,
		Request:   store.Request{Method: http.MethodPost, URI: "/cb", Header: http.Header{}, Body: []byte("id=1&code=ready")},
		Delivery:  store.Delivery{State: store.StateDelivered, UpdatedAt: now},
		ExpiresAt: now.Add(time.Hour),
	}
	if _, err := st.Insert(context.Background(), rec); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "pingback-journal") {
			t.Errorf("the store wrote the journal file %s; it runs on Badger's SyncWrites", e.Name())
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	b, err := badgerstore.Open(badgerstore.Options{Dir: dir, MinFreeSpace: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Get(context.Background(), store.Key{Provider: "2captcha", ID: "1"}); err != nil {
		t.Fatalf("the record stored without the journal, read with it: %v", err)
	}
}
