package pgtest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// connect connects to dsn without named prepared statements (which
// PgBouncer 1.18 cannot carry across transactions), closing it when t ends.
func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connecting to %s: %v", dsn, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestPgBouncerPoolModes: the bouncer StartPgBouncer starts reaches the
// target database as the target's role, and pools as asked: in transaction
// mode a session setting made by one client is seen by the next client's
// transaction (they share the server connection), in session mode it is
// not, and statement mode shares it too but refuses a transaction.
func TestPgBouncerPoolModes(t *testing.T) {
	target := pgtest.DSN(t)
	direct := connect(t, target)
	var wantUser string
	var wantPort int
	if err := direct.QueryRow(context.Background(), "SELECT current_user, inet_server_port()").Scan(&wantUser, &wantPort); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode      string
		shared    bool // whether client b sees client a's session setting
		txRefused bool // whether a multi-statement transaction is refused
	}{
		{mode: "transaction", shared: true},
		{mode: "session", shared: false},
		{mode: "statement", shared: true, txRefused: true},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			dsn, b := pgtest.StartPgBouncer(t, target, tc.mode)
			if !strings.Contains(dsn, "127.0.0.1:") || b.DSN() != dsn {
				t.Fatalf("bouncer DSN %q (DSN() %q): want one on 127.0.0.1", dsn, b.DSN())
			}
			ctx := context.Background()
			a, c := connect(t, dsn), connect(t, dsn)
			var user string
			var port int
			if err := a.QueryRow(ctx, "SELECT current_user, inet_server_port()").Scan(&user, &port); err != nil {
				t.Fatalf("query through the bouncer: %v", err)
			}
			if user != wantUser || port != wantPort {
				t.Fatalf("through the bouncer: user %s on server port %d, want %s on %d", user, port, wantUser, wantPort)
			}
			if _, err := a.Exec(ctx, "SET pgtest.mark = 'set by a'"); err != nil {
				t.Fatal(err)
			}
			var seen string
			if err := c.QueryRow(ctx, "SELECT coalesce(current_setting('pgtest.mark', true), '')").Scan(&seen); err != nil {
				t.Fatal(err)
			}
			if got := seen == "set by a"; got != tc.shared {
				t.Errorf("client b saw pgtest.mark = %q: shared server connection %v, want %v", seen, got, tc.shared)
			}

			tx, err := c.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, "SELECT 1")
				_ = tx.Rollback(ctx)
			}
			if got := err != nil; got != tc.txRefused {
				t.Errorf("transaction through the bouncer: error %v, want refused %v", err, tc.txRefused)
			}
		})
	}
}

// TestPgBouncerKillServerConnections: KillServerConnections terminates the
// backends serving the bouncer, not a direct connection of the same role,
// and the bouncer's clients are served by new backends afterwards.
func TestPgBouncerKillServerConnections(t *testing.T) {
	target := pgtest.DSN(t)
	dsn, b := pgtest.StartPgBouncer(t, target, "transaction")
	ctx := context.Background()
	bystander := connect(t, target)
	var bystanderPID int32
	if err := bystander.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&bystanderPID); err != nil {
		t.Fatal(err)
	}
	client := connect(t, dsn)
	var before int32
	if err := client.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&before); err != nil {
		t.Fatal(err)
	}

	if n := b.KillServerConnections(t); n < 1 {
		t.Fatalf("KillServerConnections terminated %d backends, want at least the one that served pid %d", n, before)
	}
	var after int32
	if err := bystander.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after); err != nil || after != bystanderPID {
		t.Fatalf("direct connection after the kill: pid %d, %v; want pid %d alive", after, err, bystanderPID)
	}
	// The first query may meet the dead server connection; PgBouncer then
	// drops it and dials a new one.
	testkit.WaitFor(t, 10*time.Second, "a query through the bouncer on a new backend", func() bool {
		var pgErr *pgconn.PgError
		err := client.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&after)
		if err != nil && !errors.As(err, &pgErr) && client.IsClosed() {
			client = connect(t, dsn)
		}
		return err == nil
	})
	if after == before {
		t.Fatalf("through the bouncer: still backend %d after KillServerConnections", before)
	}
}
