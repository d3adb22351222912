package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/pgtest"
)

// TestClusterRestart: a private cluster gives an ordinary role owning its
// database and a superuser, keeps what was committed across Restart and
// Stop/Start, and refuses connections while stopped.
func TestClusterRestart(t *testing.T) {
	start := time.Now()
	c := pgtest.StartCluster(t)
	t.Logf("StartCluster took %s", time.Since(start))
	ctx := context.Background()

	for _, tc := range []struct {
		name, dsn, user string
		super           bool
	}{
		{"DSN", c.DSN(), "pingback", false},
		{"AdminDSN", c.AdminDSN(), "pgadmin", true},
	} {
		conn := connect(t, tc.dsn)
		var user, owner string
		var super bool
		if err := conn.QueryRow(ctx, `SELECT current_user, rolsuper, pg_get_userbyid(datdba)
			FROM pg_roles, pg_database WHERE rolname = current_user AND datname = current_database()`).
			Scan(&user, &super, &owner); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if user != tc.user || super != tc.super || owner != "pingback" {
			t.Errorf("%s: user %s superuser %v, database owned by %s; want %s, %v, pingback", tc.name, user, super, owner, tc.user, tc.super)
		}
	}

	old := connect(t, c.DSN())
	if _, err := old.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	c.Restart(t)
	t.Logf("Restart took %s", time.Since(start))
	if err := old.Ping(ctx); err == nil {
		t.Error("a connection from before Restart still answers")
	}
	count := func() int {
		var n int
		if err := connect(t, c.DSN()).QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("after Restart: %d rows, want 1", n)
	}

	c.Stop(t)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(cctx, c.DSN()); err == nil {
		_ = conn.Close(ctx)
		t.Fatal("connected to the stopped cluster")
	}
	c.Start(t)
	if n := count(); n != 1 {
		t.Fatalf("after Stop and Start: %d rows, want 1", n)
	}
}
