package pgtest_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

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

// TestPgBouncerKillServerConnections: under traffic through the bouncer,
// KillServerConnections terminates the backends serving it, not a direct
// connection of the same role, and the bouncer's clients are then served by
// new backends.
func TestPgBouncerKillServerConnections(t *testing.T) {
	target := pgtest.DSN(t)
	dsn, b := pgtest.StartPgBouncer(t, target, "transaction")
	ctx := context.Background()
	bystander := connect(t, target)
	var bystanderPID int32
	if err := bystander.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&bystanderPID); err != nil {
		t.Fatal(err)
	}

	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var mu sync.Mutex
	seen := map[int32]bool{}       // backends that answered, before the kill
	var phase atomic.Int32         // 0 before the kill, 1 during it, 2 after it
	var served atomic.Int64        // answers, before the kill
	fresh := make(chan int32, 100) // backends of queries sent after the kill
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ph := phase.Load()
				var pid int32
				if err := pool.QueryRow(ctx, "SELECT pg_backend_pid() FROM pg_sleep(0.005)").Scan(&pid); err != nil {
					continue // a query on a killed server connection fails; the next is served anew
				}
				switch ph {
				case 1:
					continue
				case 0:
					mu.Lock()
					seen[pid] = true
					mu.Unlock()
					served.Add(1)
					continue
				}
				select { // phase 2
				case fresh <- pid:
				default:
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	testkit.WaitFor(t, 10*time.Second, "traffic through the bouncer", func() bool { return served.Load() > 20 })

	phase.Store(1)
	if n := b.KillServerConnections(t); n < 1 {
		t.Fatalf("KillServerConnections terminated %d backends under traffic, want at least 1", n)
	}
	phase.Store(2)
	var pid int32
	if err := bystander.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil || pid != bystanderPID {
		t.Fatalf("direct connection after the kill: pid %d, %v; want pid %d alive", pid, err, bystanderPID)
	}
	// The killed backends are gone once KillServerConnections returns: a
	// query sent after it is served by a new one.
	select {
	case pid := <-fresh:
		mu.Lock()
		defer mu.Unlock()
		if seen[pid] {
			t.Fatalf("backend %d served the bouncer before and after KillServerConnections", pid)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no query through the bouncer was served within 10 s of the kill")
	}
}
