package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
	"github.com/caddy-pingback/pingback/internal/testfs"
)

// TestPostgresPurgeVacuumFull: what docs/operations.md says of the bytes of a
// purged result on PostgreSQL. The row is gone from every query at once
// and its tombstone dedupes a re-sent result; after VACUUM FULL records and
// a checkpoint no file of the database's directory holds its code (a marker
// seen there before the purge). Needs the cluster's files on this machine,
// as with .ci/postgres; skipped otherwise. The fixture's steps (the data
// directory's name, CHECKPOINT, VACUUM FULL) run as the superuser.
func TestPostgresPurgeVacuumFull(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pgtest.AdminDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var dataDir string
	var dbOID uint32
	if err := conn.QueryRow(ctx, `SELECT current_setting('data_directory'), oid FROM pg_database WHERE datname = current_database()`).Scan(&dataDir, &dbOID); err != nil {
		t.Fatalf("reading the data directory's name: %v", err)
	}
	dbDir := filepath.Join(dataDir, "base", strconv.FormatUint(uint64(dbOID), 10))
	if _, err := os.ReadDir(dbDir); err != nil {
		t.Skipf("the cluster's files are not readable here: %v", err)
	}
	p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rnd := make([]byte, 12)
	_, _ = rand.Read(rnd)
	marker := "ERASE" + hex.EncodeToString(rnd)
	now := time.Now().UTC()
	rec := func(id, code string) *store.Record {
		return &store.Record{Provider: "2captcha", ID: id, Code: code, Source: store.SourceCallback, ReceivedAt: now,
			Request:  store.Request{Method: http.MethodPost, URI: "/cb", Host: "example.com", Body: []byte("id=" + id)},
			Delivery: store.Delivery{State: store.StateDelivered, Attempts: 1, UpdatedAt: now}, ExpiresAt: now.Add(time.Hour)}
	}
	for _, r := range []*store.Record{rec("1", marker), rec("2", "KEEP"+marker[5:])} {
		if res, err := p.Insert(ctx, r); err != nil || res.Existing != nil {
			t.Fatalf("Insert(%s) = %+v, %v", r.Key(), res, err)
		}
	}
	checkpoint := func() {
		t.Helper()
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint()
	if got := testfs.FilesContaining(t, dbDir, []byte(marker)); len(got) == 0 {
		t.Fatal("the marker is in no file of the database before the purge: the test cannot tell")
	}
	if n, err := p.Purge(ctx, store.PurgeQuery{Keys: []store.Key{{Provider: "2captcha", ID: "1"}}}); err != nil || n != 1 {
		t.Fatalf("Purge = %d, %v", n, err)
	}
	if _, err := p.Get(ctx, store.Key{Provider: "2captcha", ID: "1"}); !errors.Is(err, store.ErrPurged) {
		t.Errorf("Get after the purge: %v, want ErrPurged", err)
	}
	if res, err := p.Insert(ctx, rec("1", marker)); err != nil || !res.Purged {
		t.Errorf("Insert after the purge = %+v, %v; want a duplicate with Purged", res, err)
	}
	if _, err := conn.Exec(ctx, "VACUUM FULL "+pgx.Identifier{schema, "records"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	checkpoint()
	if got := testfs.FilesContaining(t, dbDir, []byte(marker)); len(got) != 0 {
		t.Errorf("after VACUUM FULL the marker is still in %v", got)
	}
	if got := testfs.FilesContaining(t, dbDir, []byte("KEEP"+marker[5:])); len(got) == 0 {
		t.Error("the kept record's code is in no file: the test cannot tell")
	}
}
