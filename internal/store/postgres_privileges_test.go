package store_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestPostgresLeastPrivilege: the set-up docs/storage.md gives for a
// schema of its own in an existing database. A DBA creates a role with
// no right beyond logging in, a database it does not own (the app's),
// and in it a schema the role owns; nothing else. The store opens as that
// role (it creates no schema: the schema exists), migrates the schema and
// stores a pingback. Without the schema, the open fails saying what to
// create, and creates nothing.
func TestPostgresLeastPrivilege(t *testing.T) {
	admin := pgtest.AdminDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	role, db, pw := "pb_"+suffix, "appdb_"+suffix, "pw"+suffix
	roleID, dbID := pgx.Identifier{role}.Sanitize(), pgx.Identifier{db}.Sanitize()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, q := range []string{
		"CREATE ROLE " + roleID + " LOGIN PASSWORD '" + pw + "'",
		"CREATE DATABASE " + dbID,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("cleaning up: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, q := range []string{"DROP DATABASE IF EXISTS " + dbID + " WITH (FORCE)", "DROP ROLE IF EXISTS " + roleID} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + db
	inApp := u.String()
	u.User = url.UserPassword(role, pw)
	roleDSN := u.String()

	// Without the schema: refused, naming what to do, and nothing created.
	_, err = store.OpenPostgres(store.PostgresOptions{DSN: roleDSN, Schema: "pingback"})
	if err == nil || !strings.Contains(err.Error(), "create it") {
		t.Fatalf("OpenPostgres without the schema and without CREATE on the database: %v, want a refusal that says to create the schema", err)
	}

	appConn, err := pgx.Connect(ctx, inApp)
	if err != nil {
		t.Fatal(err)
	}
	defer appConn.Close(context.Background())
	var made bool
	if err := appConn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'pingback')").Scan(&made); err != nil {
		t.Fatal(err)
	}
	if made {
		t.Fatal("the refused open created the schema")
	}
	if _, err := appConn.Exec(ctx, "CREATE SCHEMA pingback AUTHORIZATION "+roleID); err != nil {
		t.Fatal(err)
	}
	var canCreate, super bool
	if err := appConn.QueryRow(ctx, "SELECT has_database_privilege($1, current_database(), 'CREATE'), rolsuper FROM pg_roles WHERE rolname = $1", role).Scan(&canCreate, &super); err != nil {
		t.Fatal(err)
	}
	if canCreate || super {
		t.Fatalf("the role may create in the database (%v) or is a superuser (%v): the case is not least privilege", canCreate, super)
	}
	for range 2 { // the first open migrates, the second finds the schema current
		p, err := store.OpenPostgres(store.PostgresOptions{DSN: roleDSN, Schema: "pingback"})
		if err != nil {
			t.Fatalf("OpenPostgres as a role that owns only its schema: %v", err)
		}
		insertDelivered(t, p, "least-"+suffix)
		rec, err := p.Get(ctx, store.Key{Provider: "2captcha", ID: "least-" + suffix})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != store.StateDelivered {
			t.Errorf("state %s, want delivered", rec.State)
		}
		p.Close()
	}
}
