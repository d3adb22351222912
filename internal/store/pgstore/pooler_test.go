package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// TestPostgresBehindPgBouncerModes: through PgBouncer with its stock
// settings, stores open in session and transaction pooling (four at once
// on an empty schema: they migrate it once, and leave no advisory lock
// held), store and read pingbacks; statement pooling is refused at open
// with an error naming pool_mode.
func TestPostgresBehindPgBouncerModes(t *testing.T) {
	direct := pgtest.DSN(t)
	for _, mode := range []string{"session", "transaction"} {
		t.Run(mode, func(t *testing.T) {
			bounced, _ := pgtest.StartPgBouncer(t, direct, mode)
			schema := pgtest.Schema(t, direct)
			const n = 4
			stores := make([]*pgstore.Postgres, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					stores[i], errs[i] = pgstore.Open(pgstore.Options{DSN: bounced, Schema: schema})
				})
			}
			wg.Wait()
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("store %d: Open: %v", i, errs[i])
				}
				t.Cleanup(func() { stores[i].Close() })
			}
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, direct)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var versions, locks int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema}.Sanitize()+".schema_version").Scan(&versions); err != nil {
				t.Fatal(err)
			}
			if want := pgstore.SchemaVersion(); versions != want {
				t.Errorf("schema_version has %d rows, want %d: a migration ran twice or not at all", versions, want)
			}
			// The migration's lock: a bigint advisory lock (objsubid 1) on
			// the key migrate hashes, its high and low halves.
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks, hashtextextended($1, 0) AS h
				WHERE locktype = 'advisory' AND objsubid = 1
					AND classid = ((h >> 32) & 4294967295)::oid AND objid = (h & 4294967295)::oid`,
				"caddy-pingback migrate "+schema).Scan(&locks); err != nil {
				t.Fatal(err)
			}
			if locks != 0 {
				t.Errorf("the migration's advisory lock is held %d times after the stores opened: it outlived its transaction", locks)
			}
			for i, p := range stores {
				id := fmt.Sprint(mode, "-", i)
				insertDelivered(t, p, id)
				rec, err := stores[(i+1)%n].Get(ctx, store.Key{Provider: "2captcha", ID: id})
				if err != nil {
					t.Fatalf("reading %s through another store: %v", id, err)
				}
				if rec.State != store.StateDelivered {
					t.Errorf("%s: state %s, want delivered", id, rec.State)
				}
			}
		})
	}
	t.Run("statement", func(t *testing.T) {
		bounced, _ := pgtest.StartPgBouncer(t, direct, "statement")
		schema := pgtest.Schema(t, direct)
		p, err := pgstore.Open(pgstore.Options{DSN: bounced, Schema: schema, OpenWait: 2 * time.Second})
		if err == nil {
			p.Close()
			t.Fatal("Open through a statement pooler succeeded: want it refused")
		}
		if !strings.Contains(err.Error(), "pool_mode") {
			t.Errorf("error %q does not name pool_mode", err)
		}
	})
}

// TestPostgresStatementCacheBehindTransactionPooler: a DSN that asks for
// pgx's statement cache (default_query_exec_mode=cache_statement) through
// a transaction pooler keeps named prepared statements on server
// connections it does not own. When those are replaced (here: the
// pooler's server connections terminated, as a failover or an
// administrator would), the cached statements are gone (26000) or, on a
// connection another client prepared, already there (42P05): the
// operations fail, and the store logs one line naming
// default_query_exec_mode, however many errors follow.
func TestPostgresStatementCacheBehindTransactionPooler(t *testing.T) {
	direct := pgtest.DSN(t)
	bounced, bouncer := pgtest.StartPgBouncer(t, direct, "transaction")
	schema := pgtest.Schema(t, direct)
	dsn := withParam(t, bounced, "default_query_exec_mode", "cache_statement")
	core, logs := observer.New(zapcore.ErrorLevel)
	p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: schema, Logger: zap.New(core)})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	ctx := context.Background()
	for i := range 5 {
		insertDelivered(t, p, fmt.Sprint("warm-", i))
	}
	if n := bouncer.KillServerConnections(t); n == 0 {
		t.Fatal("the pooler had no server connection to terminate: the case was not set up")
	}
	failed := 0
	for i := range 20 {
		if _, err := p.Insert(ctx, retryRecord(fmt.Sprint("cache-", i), false)); err != nil {
			failed++
		}
	}
	if failed == 0 {
		t.Fatal("no insert failed after the server connections were replaced: the statement cache was not exercised")
	}
	if lines := logs.FilterMessageSnippet("default_query_exec_mode").Len(); lines != 1 {
		t.Errorf("%d inserts failed and %d log lines name default_query_exec_mode: want exactly one", failed, lines)
	}
}

// TestPostgresDurabilityCheckedPerTransaction: behind a transaction
// pooler the store's connection to the pooler outlives the server
// connections it is given, so a check when the connection is made is not
// enough. Another client of the pooler leaves synchronous_commit off on a
// server connection (a session SET, which transaction pooling does not
// reset); the store's next write on that server connection fails as not
// durable and stores nothing, and the store reports itself unavailable.
func TestPostgresDurabilityCheckedPerTransaction(t *testing.T) {
	direct := pgtest.DSN(t)
	bounced, _ := pgtest.StartPgBouncer(t, direct, "transaction")
	schema := pgtest.Schema(t, direct)
	p := openPG(t, withParam(t, bounced, "pool_max_conns", "1"), schema)
	ctx := context.Background()
	insertDelivered(t, p, "before")

	// Another client of the pooler sets it at session level on the
	// server connection it is given; PgBouncer hands out its most
	// recently used idle server connection first (server_round_robin 0,
	// its default), so the store's next transaction gets that one (the
	// SHOW below checks that the setting stayed on it).
	other, err := pgx.Connect(ctx, bounced)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	var sc string
	if err := other.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
		t.Fatal(err)
	}
	if sc != "off" {
		t.Fatalf("the pooler gave the next statement another server connection (synchronous_commit %s): the case was not set up", sc)
	}
	_, err = p.Insert(ctx, retryRecord("after", false))
	var nd *pgstore.NotDurableError
	if !errors.As(err, &nd) {
		t.Fatalf("Insert on a server connection with synchronous_commit off: %v, want a *pgstore.NotDurableError", err)
	}
	if p.Available() {
		t.Error("the store says it is available after a write refused as not durable")
	}
	conn, err := pgx.Connect(ctx, direct)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema}.Sanitize()+".records WHERE id = 'after'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Error("the refused insert was stored")
	}
}
