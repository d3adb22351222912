package pgtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// PgBouncerPath is where Debian's pgbouncer package installs PgBouncer.
const PgBouncerPath = "/usr/sbin/pgbouncer"

// EnvRequirePgBouncer, when set (as `.ci/run` does), makes the tests that
// need PgBouncer fail instead of skipping when it is not installed; CI set
// does the same.
const EnvRequirePgBouncer = "PINGBACK_REQUIRE_PGBOUNCER"

// PgBouncer is one PgBouncer process a test started with StartPgBouncer.
type PgBouncer struct {
	dsn      string // the bouncer's DSN, as StartPgBouncer returned it
	port     int    // the bouncer's listen port on 127.0.0.1
	database string // the target's database
	user     string // the target's user
	cmd      *exec.Cmd
	exited   chan struct{} // closed once cmd has exited
	logPath  string        // PgBouncer's own log (its stderr)
}

// StartPgBouncer starts PgBouncer (PgBouncerPath) in front of targetDSN's
// database on a free port of 127.0.0.1, in pool mode mode ("session",
// "transaction" or "statement"), and stops it when t ends (SIGTERM, then
// SIGKILL after 5 s). It returns the DSN to connect through it (targetDSN's
// user, password, database and parameters; the bouncer's host and port) and
// the bouncer.
//
// The config sets only listen_addr, listen_port, auth_type (scram-sha-256),
// auth_file (targetDSN's user and password, in plain text) and pool_mode,
// and one [databases] entry named after targetDSN's database pointing at
// its host and port: everything else is PgBouncer's stock setting (no
// ignore_startup_parameters, no max_prepared_statements; PgBouncer 1.18,
// Debian 12's, has no prepared statements in transaction mode at all). It
// runs in the foreground, logging to a file in its directory that is shown
// when t fails. When the test runs as root PgBouncer runs as the user
// postgres (it refuses to run as root).
//
// StartPgBouncer returns once a connection through the bouncer to the
// database succeeds. It skips t when PgBouncer is not installed (fails it
// when CI or EnvRequirePgBouncer is set) and fails t on a bad targetDSN or
// mode or when PgBouncer does not start within 15 s.
func StartPgBouncer(t testing.TB, targetDSN, mode string) (string, *PgBouncer) {
	t.Helper()
	switch mode {
	case "session", "transaction", "statement":
	default:
		t.Fatalf("pgtest: pool mode %q: want session, transaction or statement", mode)
	}
	if _, err := os.Stat(PgBouncerPath); err != nil {
		notRun(t, "PgBouncer tests NOT RUN: "+PgBouncerPath+" is missing ("+err.Error()+").",
			"Install it with: apt-get install pgbouncer", EnvRequirePgBouncer)
	}
	cfg, err := pgx.ParseConfig(targetDSN)
	if err != nil {
		t.Fatalf("pgtest: parsing the target DSN: %v", err)
	}
	if !plainName.MatchString(cfg.Database) {
		t.Fatalf("pgtest: database %q: StartPgBouncer takes names of letters, digits and _ only", cfg.Database)
	}
	r := newRunner(t)
	dir := r.tempDir(t, "pingback-pgbouncer-")
	r.writeFile(t, filepath.Join(dir, "users.txt"), pgbouncerQuote(cfg.User)+" "+pgbouncerQuote(cfg.Password)+"\n")

	// The free port is free when it is chosen, not necessarily when
	// PgBouncer binds it: a port taken meanwhile is retried with another.
	var lastLog string
	for range 3 {
		port, _ := strconv.Atoi(testkit.UnusedLoopbackPort(t))
		b := &PgBouncer{
			port:     port,
			database: cfg.Database,
			user:     cfg.User,
			exited:   make(chan struct{}),
			logPath:  filepath.Join(dir, "pgbouncer-"+strconv.Itoa(port)+".log"),
		}
		b.dsn = withHostPort(t, targetDSN, "127.0.0.1", port)
		conf := filepath.Join(dir, "pgbouncer-"+strconv.Itoa(port)+".ini")
		r.writeFile(t, conf, fmt.Sprintf(`[databases]
%s = host=%s port=%d dbname=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
auth_type = scram-sha-256
auth_file = %s
pool_mode = %s
`, cfg.Database, cfg.Host, cfg.Port, cfg.Database, port, filepath.Join(dir, "users.txt"), mode))
		lf, err := os.Create(b.logPath)
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		b.cmd = r.command(dir, PgBouncerPath, conf)
		b.cmd.Stdout, b.cmd.Stderr = lf, lf
		if err := b.cmd.Start(); err != nil {
			_ = lf.Close()
			t.Fatalf("pgtest: starting pgbouncer: %v", err)
		}
		go func() {
			_ = b.cmd.Wait()
			_ = lf.Close()
			close(b.exited)
		}()
		err = b.waitReady(15 * time.Second)
		if err == nil {
			t.Cleanup(func() {
				b.Stop(t)
				if t.Failed() {
					t.Logf("pgtest: PgBouncer's log (%s mode, port %d):\n%s", mode, port, b.log())
				}
			})
			return b.dsn, b
		}
		b.Stop(t)
		lastLog = b.log()
		if !strings.Contains(lastLog, "Address already in use") {
			t.Fatalf("pgtest: PgBouncer did not start: %v\nits log:\n%s", err, lastLog)
		}
	}
	t.Fatalf("pgtest: PgBouncer found no free port in 3 tries; its last log:\n%s", lastLog)
	return "", nil
}

// DSN returns the DSN to connect through the bouncer.
func (b *PgBouncer) DSN() string { return b.dsn }

// Port returns the bouncer's listen port on 127.0.0.1.
func (b *PgBouncer) Port() int { return b.port }

// Stop stops the bouncer (SIGTERM, then SIGKILL after 5 s) and waits until
// it has exited; clients connected through it lose their connections. It
// does nothing on a bouncer already stopped; StartPgBouncer calls it when
// t ends.
func (b *PgBouncer) Stop(t testing.TB) {
	t.Helper()
	select {
	case <-b.exited:
		return
	default:
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
		return
	case <-time.After(5 * time.Second):
	}
	_ = b.cmd.Process.Kill()
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		t.Errorf("pgtest: PgBouncer (pid %d) still running 10 s after SIGKILL", b.cmd.Process.Pid)
	}
}

// waitReady returns nil once a connection through the bouncer answers a
// query, or an error when PgBouncer exits first or timeout passes.
func (b *PgBouncer) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := pingOnce(b.dsn)
		if err == nil {
			return nil
		}
		select {
		case <-b.exited:
			return fmt.Errorf("pgbouncer exited: %v", b.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no connection through it after %s: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// KillServerConnections terminates, with pg_terminate_backend through
// AdminDSN, every PostgreSQL backend serving one of the bouncer's server
// connections (found by their client ports: the bouncer's sockets connected
// to the server), as a failover or an administrator would, and waits until
// they are gone. Other clients of the same database and role, such as a
// fixture's direct connection or another test's store, are left alone.
// Clients connected through the bouncer keep their client connections;
// what PgBouncer does with them is what is under test. It returns how many
// backends it terminated (0 when the bouncer had no server connection).
func (b *PgBouncer) KillServerConnections(t testing.TB) int {
	t.Helper()
	admin := AdminDSN(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("pgtest: connecting as the administrator: %v", err)
	}
	defer conn.Close(ctx)
	ports, err := localPortsOf(b.cmd.Process.Pid)
	if err != nil {
		t.Fatalf("pgtest: finding PgBouncer's server connections: %v", err)
	}
	var pids []int32
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity
		WHERE client_addr = '127.0.0.1' AND client_port = ANY($1) AND datname = $2 AND usename = $3
		AND pid <> pg_backend_pid()`, ports, b.database, b.user).Scan(&pids); err != nil {
		t.Fatalf("pgtest: finding PgBouncer's backends: %v", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS p(pid)`, pids); err != nil {
		t.Fatalf("pgtest: terminating PgBouncer's backends: %v", err)
	}
	for {
		var left int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, pids).Scan(&left); err != nil {
			t.Fatalf("pgtest: counting PgBouncer's terminated backends: %v", err)
		}
		if left == 0 {
			return len(pids)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("pgtest: %d of PgBouncer's backends still there after pg_terminate_backend", left)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// log returns PgBouncer's log so far.
func (b *PgBouncer) log() string {
	out, err := os.ReadFile(b.logPath)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return string(out)
}

// pingOnce connects to dsn and runs one query, within 2 s.
func pingOnce(dsn string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// withHostPort returns dsn with its host and port replaced: in a URL DSN
// its authority's host part, in a keyword/value DSN by appended keywords
// (the last of a keyword wins).
func withHostPort(t testing.TB, dsn, host string, port int) string {
	t.Helper()
	hp := net.JoinHostPort(host, strconv.Itoa(port))
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("pgtest: parsing the target DSN: %v", err)
		}
		u.Host = hp
		q := u.Query()
		if q.Has("host") || q.Has("port") {
			q.Del("host")
			q.Del("port")
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	return dsn + " host=" + host + " port=" + strconv.Itoa(port)
}

// plainName matches the database names StartPgBouncer writes into
// PgBouncer's config unquoted.
var plainName = regexp.MustCompile(`^[A-Za-z0-9_]+$`)

// pgbouncerQuote quotes s for PgBouncer's auth_file (double quotes, a
// double quote doubled).
func pgbouncerQuote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}
