package pgtest

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"testing"
)

// runnerName is the unprivileged OS user that runs PostgreSQL and PgBouncer
// when the tests run as root (both refuse to run as root): the user the
// postgresql package creates, the one `.ci/postgres` uses too.
const runnerName = "postgres"

// runner is the OS user the servers a test starts run as.
type runner struct {
	cred *syscall.Credential // nil: the test's own user
}

// newRunner returns the test's own user, or postgres when the test runs as
// root; it fails t when root has no postgres user.
func newRunner(t testing.TB) runner {
	t.Helper()
	if os.Geteuid() != 0 {
		return runner{}
	}
	u, err := user.Lookup(runnerName)
	if err != nil {
		t.Fatalf("pgtest: running as root, the servers must run as the unprivileged user %s "+
			"(created by the postgresql package): %v", runnerName, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		t.Fatalf("pgtest: uid of %s: %v", runnerName, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		t.Fatalf("pgtest: gid of %s: %v", runnerName, err)
	}
	return runner{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
}

// command returns cmd with args, run as r in dir (so that its working
// directory is one r may enter).
func (r runner) command(dir, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if r.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	}
	return cmd
}

// tempDir makes a new directory in the system's temporary directory that r
// owns (t.TempDir's parents are private to the test's user), and removes it
// when t ends, after the cleanups registered later (the servers' stops).
func (r runner) tempDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("pgtest: removing %s: %v", dir, err)
		}
	})
	r.chown(t, dir)
	return dir
}

// writeFile writes a file of mode 0600 that r owns.
func (r runner) writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	r.chown(t, path)
}

func (r runner) chown(t testing.TB, path string) {
	t.Helper()
	if r.cred == nil {
		return
	}
	if err := os.Chown(path, int(r.cred.Uid), int(r.cred.Gid)); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
}
