package pgstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// TestPostgresEveryConnectionDurable: synchronous_commit is checked on
// every new connection of the store's pool, not once at open. The store
// opens as a role of its own; then ALTER ROLE ... SET synchronous_commit
// = off and the role's sessions are ended, so the pool must reconnect:
// every new connection is refused (a *pgstore.NotDurableError), no insert
// succeeds and the store reports itself unavailable; with the setting
// back, it recovers by itself.
func TestPostgresEveryConnectionDurable(t *testing.T) {
	dsn, adminDSN, schema, ctx, admin := adminSetup(t) // admin: CREATE ROLE, ALTER ROLE, other roles' backends
	var b [6]byte
	_, _ = rand.Read(b[:])
	role := "r_" + hex.EncodeToString(b[:])
	pw := hex.EncodeToString(b[:]) + "pw"
	ident := pgx.Identifier{role}.Sanitize()
	var db string
	if err := admin.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE ROLE " + ident + " LOGIN PASSWORD '" + pw + "'",
		"GRANT CREATE ON DATABASE " + pgx.Identifier{db}.Sanitize() + " TO " + ident,
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pgtest.Drop(t, adminDSN, schema) // before the role: it owns the schema
		admin, err := pgx.Connect(ctx, adminDSN)
		if err != nil {
			t.Errorf("dropping role %s: %v", role, err)
			return
		}
		defer admin.Close(context.Background())
		for _, q := range []string{"DROP OWNED BY " + ident, "DROP ROLE " + ident} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Skipf("DSN is not a URL: %v", err)
	}
	u.User = url.UserPassword(role, pw)
	p := openPG(t, u.String(), schema)

	insert := func(id string) error {
		now := time.Now().UTC()
		_, err := p.Insert(ctx, &store.Record{
			Provider: "2captcha", ID: id, Code: "C", Source: store.SourceCallback, ReceivedAt: now,
			Request:   store.Request{Method: "GET", URI: "/pb?id=" + id, Host: "example.com"},
			Delivery:  store.Delivery{State: store.StateForwarding, Attempts: 1, Lease: store.Lease{Until: now.Add(time.Minute)}, UpdatedAt: now},
			ExpiresAt: now.Add(time.Hour),
		})
		return err
	}
	if err := insert("1"); err != nil {
		t.Fatalf("insert with synchronous_commit on: %v", err)
	}
	// Only sessions made from now on see the change: end the current ones.
	terminate := func() {
		t.Helper()
		if _, err := admin.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Exec(ctx, "ALTER ROLE "+ident+" SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	terminate()
	var refused error
	for i := range 10 {
		err := insert("off-" + string(rune('a'+i)))
		if err == nil {
			t.Fatalf("insert %d committed on a connection made with synchronous_commit off", i)
		}
		var nd *pgstore.NotDurableError
		if errors.As(err, &nd) {
			refused = err
		}
	}
	if refused == nil || !strings.Contains(refused.Error(), "synchronous_commit is off") {
		t.Fatalf("no insert was refused for synchronous_commit off (last refusal %v)", refused)
	}
	deadline := time.Now().Add(10 * time.Second)
	for p.Available() {
		if time.Now().After(deadline) {
			t.Fatal("the store stayed available while every new connection is refused")
		}
		time.Sleep(50 * time.Millisecond) // polling the monitor's state, not synchronising with it
	}
	if _, err := admin.Exec(ctx, "ALTER ROLE "+ident+" RESET synchronous_commit"); err != nil {
		t.Fatal(err)
	}
	for !p.Available() {
		if time.Now().After(deadline.Add(10 * time.Second)) {
			t.Fatal("the store did not recover once synchronous_commit was on again")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := insert("2"); err != nil {
		t.Fatalf("insert after synchronous_commit is on again: %v", err)
	}
}

// TestPostgresFsyncOffLogged: a server running with fsync off (ALTER
// SYSTEM, reloaded) is not refused (only synchronous_commit off is), but
// the store says at error level, when it connects, that acknowledged
// pingbacks can then be lost.
func TestPostgresFsyncOffLogged(t *testing.T) {
	dsn, adminDSN, schema, ctx, admin := adminSetup(t) // admin: ALTER SYSTEM
	setFsync := func(q string) {
		t.Helper()
		for _, q := range []string{q, "SELECT pg_reload_conf()"} {
			if _, err := admin.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	setFsync("ALTER SYSTEM SET fsync = off")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, adminDSN)
		if err != nil {
			t.Errorf("resetting fsync: %v", err)
			return
		}
		defer c.Close(context.Background())
		for _, q := range []string{"ALTER SYSTEM RESET fsync", "SELECT pg_reload_conf()"} {
			if _, err := c.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	// pg_reload_conf only signals: wait until new sessions see fsync off.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		var v string
		err = c.QueryRow(ctx, "SHOW fsync").Scan(&v)
		c.Close(context.Background())
		if err == nil && v == "off" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fsync still %q after the reload (%v)", v, err)
		}
		time.Sleep(50 * time.Millisecond) // polling the server's state
	}
	core, logs := observer.New(zap.ErrorLevel)
	p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: schema, Logger: zap.New(core)})
	if err != nil {
		t.Fatalf("Open with fsync off: %v; want it to open (and say so)", err)
	}
	p.Close()
	if n := logs.FilterMessageSnippet("fsync off").Len(); n != 1 {
		t.Errorf("%d error lines about fsync off, want 1 (logs: %v)", n, logs.All())
	}
}

// adminSetup gives a durability test the store's DSN, the admin DSN, a
// schema of its own, a context of a minute and a connection as the
// admin, all released at the test's end.
func adminSetup(t *testing.T) (dsn, adminDSN, schema string, ctx context.Context, admin *pgx.Conn) {
	t.Helper()
	dsn, adminDSN = pgtest.DSN(t), pgtest.AdminDSN(t)
	schema = pgtest.Schema(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	admin, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	return dsn, adminDSN, schema, ctx, admin
}
