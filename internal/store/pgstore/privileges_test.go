package pgstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// TestPostgresLeastPrivilege: the set-up docs/storage.md gives for a
// schema of its own in an existing database. A DBA creates a role with
// no right beyond logging in, a database it does not own (the app's),
// and in it a schema the role owns; nothing else. The store opens as that
// role (it creates no schema: the schema exists), migrates the schema and
// stores a pingback. Without the schema, the open fails saying what to
// create, and creates nothing.
func TestPostgresLeastPrivilege(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lp := pgtest.NewLeastPrivilege(t)
	roleDSN, inApp, role := lp.DSN, lp.AppDSN, lp.Role
	suffix := role

	// Without the schema: refused, naming what to do, and nothing created.
	_, err := pgstore.Open(pgstore.Options{DSN: roleDSN, Schema: "pingback"})
	if err == nil || !strings.Contains(err.Error(), "create it") {
		t.Fatalf("Open without the schema and without CREATE on the database: %v, want a refusal that says to create the schema", err)
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
	lp.CreateSchema(t, "pingback")
	var canCreate, super bool
	if err := appConn.QueryRow(ctx, "SELECT has_database_privilege($1, current_database(), 'CREATE'), rolsuper FROM pg_roles WHERE rolname = $1", role).Scan(&canCreate, &super); err != nil {
		t.Fatal(err)
	}
	if canCreate || super {
		t.Fatalf("the role may create in the database (%v) or is a superuser (%v): the case is not least privilege", canCreate, super)
	}
	for range 2 { // the first open migrates, the second finds the schema current
		p, err := pgstore.Open(pgstore.Options{DSN: roleDSN, Schema: "pingback"})
		if err != nil {
			t.Fatalf("Open as a role that owns only its schema: %v", err)
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
