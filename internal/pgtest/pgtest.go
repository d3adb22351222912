// Package pgtest gives tests a real PostgreSQL database: the DSN in
// PINGBACK_TEST_PG_DSN (`.ci/run` starts a throw-away cluster and sets it).
// Without it the PostgreSQL tests skip with a loud message, except in CI
// (CI set), where they fail.
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

// EnvDSN is the environment variable holding the test database's DSN.
const EnvDSN = "PINGBACK_TEST_PG_DSN"

// DSN returns the test database's DSN, or skips t (fails it in CI).
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn != "" {
		return dsn
	}
	const msg = "\n*** PostgreSQL tests NOT RUN: " + EnvDSN + " is not set. ***\n" +
		"*** Start a throw-away cluster with: eval \"$(bash .ci/postgres start)\" ***"
	if os.Getenv("CI") != "" {
		t.Fatal(msg + "\n*** CI is set: the PostgreSQL tests must run. ***")
	}
	t.Skip(msg)
	return ""
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
