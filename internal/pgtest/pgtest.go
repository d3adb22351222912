// Package pgtest gives tests a real PostgreSQL database: the DSN in
// PINGBACK_TEST_PG_DSN, an ordinary role that owns its database, and the
// superuser DSN in PINGBACK_TEST_PG_ADMIN_DSN for fixtures that need more
// (`.ci/run` starts a throw-away cluster and sets both). Without them the
// PostgreSQL tests skip with a loud message, except in CI (CI set), where
// they fail. It also starts a PgBouncer in front of a database
// (StartPgBouncer), a private cluster a test may stop and restart
// (StartCluster), and a role that owns nothing but the schema a test
// gives it (NewLeastPrivilege).
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN is the environment variable holding the test database's DSN: an
// ordinary role (not a superuser, no CREATEDB or CREATEROLE) that owns the
// database, as the stores under test should run.
const EnvDSN = "PINGBACK_TEST_PG_DSN"

// EnvAdminDSN is the environment variable holding a superuser's DSN on the
// same database as EnvDSN's, for fixtures that need more than its owner
// may do: other roles, ALTER SYSTEM, terminating other roles' backends,
// VACUUM FULL.
const EnvAdminDSN = "PINGBACK_TEST_PG_ADMIN_DSN"

// DSN returns the test database's DSN (EnvDSN), or skips t (fails it in CI).
func DSN(t testing.TB) string {
	t.Helper()
	return envDSN(t, EnvDSN)
}

// AdminDSN returns the superuser's DSN (EnvAdminDSN), or skips t (fails it
// in CI).
func AdminDSN(t testing.TB) string {
	t.Helper()
	return envDSN(t, EnvAdminDSN)
}

func envDSN(t testing.TB, env string) string {
	t.Helper()
	dsn := os.Getenv(env)
	if dsn != "" {
		return dsn
	}
	notRun(t, "PostgreSQL tests NOT RUN: "+env+" is not set.",
		"Start a throw-away cluster with: eval \"$(bash .ci/postgres start)\"")
	return ""
}

// notRun skips t with a loud message, or fails it when CI or any of the
// variables in require is set.
func notRun(t testing.TB, why, howto string, require ...string) {
	t.Helper()
	msg := "\n*** " + why + " ***\n*** " + howto + " ***"
	for _, env := range append([]string{"CI"}, require...) {
		if os.Getenv(env) != "" {
			t.Fatal(msg + "\n*** " + env + " is set: these tests must run. ***")
		}
	}
	t.Skip(msg)
}

// Schema returns a new schema name, unique to this run, and drops the
// schema with everything in it when t ends.
func Schema(t testing.TB, dsn string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() { Drop(t, dsn, name) })
	return name
}

// Drop drops schema from the database, if it exists.
func Drop(t testing.TB, dsn, schema string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Errorf("pgtest: connecting to drop schema %s: %v", schema, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		t.Errorf("pgtest: dropping schema %s: %v", schema, err)
	}
}

// AppName returns a new application_name, unique to this run, for the
// connections of one store under test, so that Terminate hits them and no
// other test's.
func AppName(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "pingback-test-" + hex.EncodeToString(b[:])
}

// Terminate ends every backend whose application_name is app with
// pg_terminate_backend (as an administrator does), waits until they are
// gone from pg_stat_activity, and returns how many there were (new
// connections the store dials meanwhile are not waited for).
func Terminate(t testing.TB, dsn, app string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: connecting to terminate backends: %v", err)
	}
	defer conn.Close(ctx)
	// The backends are chosen first and terminated in a second statement:
	// in one, the planner may call pg_terminate_backend before filtering.
	var pids []int32
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&pids); err != nil {
		t.Fatalf("pgtest: finding backends of %s: %v", app, err)
	}
	terminatePIDs(ctx, t, conn, pids, "backends of "+app)
	return len(pids)
}

// terminatePIDs ends the backends pids with pg_terminate_backend and waits
// until they are gone from pg_stat_activity; what names them in failures.
func terminatePIDs(ctx context.Context, t testing.TB, conn *pgx.Conn, pids []int32, what string) {
	t.Helper()
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS p(pid)`, pids); err != nil {
		t.Fatalf("pgtest: terminating %s: %v", what, err)
	}
	for {
		var left int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left); err != nil {
			t.Fatalf("pgtest: counting terminated %s: %v", what, err)
		}
		if left == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pgtest: %d %s still there after pg_terminate_backend", left, what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}
