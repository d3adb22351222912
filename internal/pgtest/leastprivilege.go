package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// LeastPrivilege is a role with no right beyond logging in and a database
// it does not own (an application's), made by NewLeastPrivilege: the
// set-up docs/storage.md gives for a schema of the plugin's own in an
// existing database.
type LeastPrivilege struct {
	// DSN connects as the role to the database.
	DSN string
	// AppDSN connects as the superuser to the same database.
	AppDSN string
	// Role is the role's name.
	Role string
}

// NewLeastPrivilege creates, through AdminDSN, a login role that is not a
// superuser and has no CREATE right on any database, and a new database
// owned by the superuser; both are dropped when t ends. The schema the
// store uses is left to the test (CreateSchema).
func NewLeastPrivilege(t testing.TB) *LeastPrivilege {
	t.Helper()
	admin := AdminDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var b [6]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	role, db, pw := "pb_"+suffix, "appdb_"+suffix, "pw"+suffix
	roleID, dbID := pgx.Identifier{role}.Sanitize(), pgx.Identifier{db}.Sanitize()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("pgtest: connecting as the administrator: %v", err)
	}
	defer conn.Close(context.Background())
	for _, q := range []string{
		"CREATE ROLE " + roleID + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '" + pw + "'",
		"CREATE DATABASE " + dbID,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("pgtest: %s: %v", q, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("pgtest: dropping the least-privilege role: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, q := range []string{"DROP DATABASE IF EXISTS " + dbID + " WITH (FORCE)", "DROP ROLE IF EXISTS " + roleID} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Errorf("pgtest: %s: %v", q, err)
			}
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("pgtest: the admin DSN is not a URL: %v", err)
	}
	u.Path = "/" + db
	lp := &LeastPrivilege{AppDSN: u.String(), Role: role}
	u.User = url.UserPassword(role, pw)
	lp.DSN = u.String()
	return lp
}

// CreateSchema creates schema in the database, owned by the role, as a DBA
// would: the one right the store needs.
func (lp *LeastPrivilege) CreateSchema(t testing.TB, schema string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, lp.AppDSN)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()+" AUTHORIZATION "+pgx.Identifier{lp.Role}.Sanitize()); err != nil {
		t.Fatalf("pgtest: creating schema %s: %v", schema, err)
	}
}
