package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// EnvPGBin is the environment variable `.ci/postgres` sets to PostgreSQL's
// bin directory (the one holding initdb and pg_ctl).
const EnvPGBin = "PINGBACK_PG_BIN"

// Cluster is a private PostgreSQL cluster of one test, which the test may
// stop, start and restart without disturbing any other test.
type Cluster struct {
	bin, dir string // PostgreSQL's bin directory; the cluster's directory
	port     int    // on 127.0.0.1
	dsn      string // the role pingback, owner of the database pingback
	adminDSN string // the superuser pgadmin, on the database pingback
	r        runner
}

// StartCluster creates and starts a private cluster for t on a free port
// of 127.0.0.1 (initdb as the unprivileged user postgres when the test runs
// as root, in a new temporary directory it owns; scram-sha-256 with random
// passwords; max_connections 50; fsync on), with, as `.ci/postgres` makes:
// the superuser pgadmin and the ordinary role pingback owning the database
// pingback. It stops the cluster (immediate mode) and removes it when t
// ends. It takes about a second or two.
//
// It skips t when PostgreSQL's initdb is not found in EnvPGBin,
// /usr/lib/postgresql/*/bin or PATH (fails it in CI), and fails t when the
// cluster does not start.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	bin, ok := findPGBin()
	if !ok {
		notRun(t, "private PostgreSQL cluster NOT STARTED: initdb not found in $"+EnvPGBin+
			", /usr/lib/postgresql/*/bin or PATH.", "Install it with: apt-get install postgresql")
	}
	r := newRunner(t)
	c := &Cluster{bin: bin, dir: r.tempDir(t, "pingback-pgcluster-"), r: r}
	adminPW, pw := randomHex(t), randomHex(t)
	r.writeFile(t, filepath.Join(c.dir, "pw"), adminPW+"\n")
	c.run(t, "initdb", "-D", c.data(), "-U", "pgadmin", "--pwfile="+filepath.Join(c.dir, "pw"),
		"--auth=scram-sha-256", "-E", "UTF8", "--no-sync", "--no-instructions")
	if err := os.Remove(filepath.Join(c.dir, "pw")); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		// Errors are expected when the test left it stopped.
		_, _ = c.r.command(c.dir, filepath.Join(c.bin, "pg_ctl"), "-D", c.data(), "-m", "immediate", "-w", "stop").CombinedOutput()
	})
	// A port taken between its choice and the server's bind is retried. It
	// lies below the ephemeral range (testkit.ProcessPort): the cluster
	// binds it again after Stop or Restart, and meanwhile no listener on
	// :0 or outgoing connection of another test process can take it.
	for try := 1; ; try++ {
		port, err := testkit.ProcessPort()
		if err != nil {
			t.Fatalf("pgtest: %v", err)
		}
		c.port, _ = strconv.Atoi(port)
		if err := c.pgctl("start"); err == nil {
			break
		} else if try == 3 {
			t.Fatalf("pgtest: starting the private cluster: %v", err)
		}
	}
	c.adminDSN = fmt.Sprintf("postgres://pgadmin:%s@127.0.0.1:%d/pingback?sslmode=disable", adminPW, c.port)
	c.dsn = fmt.Sprintf("postgres://pingback:%s@127.0.0.1:%d/pingback?sslmode=disable", pw, c.port)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://pgadmin:%s@127.0.0.1:%d/postgres?sslmode=disable", adminPW, c.port))
	if err != nil {
		t.Fatalf("pgtest: connecting to the private cluster: %v", err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		// pw is hex: no quoting needed.
		"CREATE ROLE pingback LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '" + pw + "'",
		"CREATE DATABASE pingback OWNER pingback",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("pgtest: setting up the private cluster: %s: %v", q, err)
		}
	}
	return c
}

// DSN returns the DSN of the ordinary role pingback on its database
// pingback (as PINGBACK_TEST_PG_DSN).
func (c *Cluster) DSN() string { return c.dsn }

// AdminDSN returns the DSN of the superuser pgadmin on the database
// pingback (as PINGBACK_TEST_PG_ADMIN_DSN).
func (c *Cluster) AdminDSN() string { return c.adminDSN }

// Port returns the cluster's port on 127.0.0.1.
func (c *Cluster) Port() int { return c.port }

// Stop stops the cluster in fast mode (pg_ctl -m fast: open transactions
// rolled back, clients disconnected, a shutdown checkpoint) and returns
// once it is down; connections are refused until Start.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	if err := c.pgctl("stop"); err != nil {
		t.Fatalf("pgtest: stopping the private cluster: %v", err)
	}
}

// Start starts the stopped cluster on its port and returns once it accepts
// connections.
func (c *Cluster) Start(t testing.TB) {
	t.Helper()
	if err := c.pgctl("start"); err != nil {
		t.Fatalf("pgtest: starting the private cluster: %v", err)
	}
}

// Restart stops the cluster in fast mode and starts it again (pg_ctl
// restart -m fast), returning once it accepts connections.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	if err := c.pgctl("restart"); err != nil {
		t.Fatalf("pgtest: restarting the private cluster: %v", err)
	}
}

// pgctl runs pg_ctl's start, stop or restart, waiting up to 60 s; an error
// carries pg_ctl's output and the server log's end.
func (c *Cluster) pgctl(action string) error {
	args := []string{"-D", c.data(), "-w", "-t", "60"}
	switch action {
	case "stop":
		args = append(args, "-m", "fast", "stop")
	case "restart":
		args = append(args, "-m", "fast")
		fallthrough
	case "start":
		args = append(args, "-l", filepath.Join(c.dir, "log"), action, "-o",
			fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c max_connections=50", c.port, c.dir))
	}
	out, err := c.r.command(c.dir, filepath.Join(c.bin, "pg_ctl"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s\nserver log:\n%s", action, err, out, tail(filepath.Join(c.dir, "log"), 2000))
	}
	return nil
}

// run runs the PostgreSQL program name as the cluster's user, failing t
// with its output when it fails.
func (c *Cluster) run(t testing.TB, name string, args ...string) {
	t.Helper()
	out, err := c.r.command(c.dir, filepath.Join(c.bin, name), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("pgtest: %s: %v\n%s", name, err, out)
	}
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

// findPGBin returns the directory of PostgreSQL's initdb: EnvPGBin, the
// first /usr/lib/postgresql/*/bin that has it (Debian's layout), or PATH's.
func findPGBin() (string, bool) {
	dirs := []string{os.Getenv(EnvPGBin)}
	versions, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	dirs = append(dirs, versions...)
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if fi, err := os.Stat(filepath.Join(d, "initdb")); err == nil && !fi.IsDir() {
			return d, true
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), true
	}
	return "", false
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// randomHex returns 12 random bytes in hex: a password that needs no
// quoting in SQL or a DSN.
func randomHex(t testing.TB) string {
	t.Helper()
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return hex.EncodeToString(b[:])
}
