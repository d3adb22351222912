package badgerstore

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// asNobody runs a command as the unprivileged user nobody (uid 65534)
// and reports whether it succeeded, with its output. It skips the test
// when that cannot be done (not root, or no such binary).
func asNobody(t *testing.T, name string, args ...string) (bool, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("checking modes as another user needs root to start a child as nobody (syscall.Credential); not root here")
	}
	path, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("no %s to run as nobody: %v", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("running %s as nobody: %v", name, err)
	}
	return err == nil, string(out)
}

// TestBadgerDirModes opens a store whose directory already exists with
// mode 0755 and holds the store's files readable by everyone (0644), as a
// store created before this version or under a umask of 022 does: the open
// makes the directory 0700 and every file 0600, and the unprivileged user
// nobody, who could read a file and list the directory before, can do
// neither after.
func TestBadgerDirModes(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("file modes do not control access on Windows")
	}
	root := t.TempDir()
	// nobody must be able to reach the store's directory, as under
	// /var/lib: the temp dirs are 0700.
	for _, d := range []string{filepath.Dir(root), root} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(root, "store")
	b, err := openChecked(Options{Dir: dir, JournalSize: minJournalSize})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Insert(ctx, testRecord("1", store.StateQueued)); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// As an earlier version or a careless operator left it.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
		if err := os.Chmod(filepath.Join(dir, e.Name()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	manifest := filepath.Join(dir, "MANIFEST")
	if ok, out := asNobody(t, "cat", manifest); !ok {
		t.Fatalf("before the open, nobody cannot read the 0644 MANIFEST in the 0755 directory (%s): the check below would prove nothing", out)
	}

	b = openTestBadger(t, Options{Dir: dir, JournalSize: minJournalSize})
	if _, err := b.Get(ctx, key("1")); err != nil {
		t.Fatalf("the record after the reopen: %v", err)
	}
	info, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %o, want 700", info.Mode().Perm())
	}
	entries, _ = os.ReadDir(dir)
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %o, want 600", e.Name(), fi.Mode().Perm())
		}
	}
	if len(entries) < len(files) || !strings.Contains(strings.Join(files, " "), "pingback-journal.0") {
		t.Errorf("files before %v, after %d: the check did not see the journal", files, len(entries))
	}
	if ok, out := asNobody(t, "cat", manifest); ok {
		t.Errorf("nobody read the MANIFEST after the open: %s", out)
	}
	if ok, out := asNobody(t, "ls", dir); ok {
		t.Errorf("nobody listed the store's directory after the open: %s", out)
	}
}

// TestBadgerDirForeignFile checks that a directory holding a file that is
// not the store's, or a subdirectory, refuses the start with an error
// naming it, and changes no mode.
func TestBadgerDirForeignFile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(dir string) error
		names string
	}{
		{"a foreign file", func(dir string) error { return os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644) }, "notes.txt"},
		{"a subdirectory", func(dir string) error { return os.Mkdir(filepath.Join(dir, "000001.sst"), 0o755) }, "000001.sst"},
		{"a symbolic link", func(dir string) error { return os.Symlink("/etc/passwd", filepath.Join(dir, "MANIFEST")) }, "MANIFEST"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "shared")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := tc.setup(dir); err != nil {
				t.Fatal(err)
			}
			b, err := openChecked(Options{Dir: dir, LockWait: time.Millisecond})
			if err == nil {
				_ = b.Close()
				t.Fatal("opened a store in a directory holding " + tc.name)
			}
			if !strings.Contains(err.Error(), tc.names) || !strings.Contains(err.Error(), "not one of the store's files") {
				t.Errorf("error %q: want it to name %s and say it is not the store's", err, tc.names)
			}
			if info, _ := os.Stat(dir); info.Mode().Perm() != 0o755 {
				t.Errorf("the refused directory's mode changed to %o", info.Mode().Perm())
			}
		})
	}
}

// TestIsStoreFile pins the names the store takes for its own.
func TestIsStoreFile(t *testing.T) {
	for name, want := range map[string]bool{
		"MANIFEST": true, "KEYREGISTRY": true, "LOCK": true, "DISCARD": true, "000001.sst": true, "000002.vlog": true,
		"00003.mem": true, "pingback-journal.0": true, "pingback-journal.1": true, "pingback-journal.ckpt": true,
		"MANIFEST-REWRITE": true, "REWRITE-KEYREGISTRY": true,
		".sst": false, "a.sst": false, "pingback-journal.2": false, "notes.txt": false, "": false, "manifest": false,
	} {
		if got := isStoreFile(name); got != want {
			t.Errorf("isStoreFile(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestBadgerExpiryNeverWraps checks that a record or task whose expiry is
// at or before 1970 (year 1 included) is expired at once, never kept
// forever (Badger's ExpiresAt 0 means "never"; a negative Unix time turned
// unsigned is a time far in the future).
func TestBadgerExpiryNeverWraps(t *testing.T) {
	for _, exp := range []time.Time{time.Unix(0, 0), time.Unix(-1, 0), time.Date(1, 1, 1, 0, 0, 1, 0, time.UTC), time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC)} {
		if e := expiry(exp); e != 1 {
			t.Errorf("expiry(%s) = %d, want 1 (expired at once)", exp, e)
		}
	}
	if e := expiry(time.Time{}); e != 0 { // the API's "no TTL", for index keys
		t.Errorf("expiry(zero time) = %d, want 0 (no TTL)", e)
	}
	if e := store.UnixNano(time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)); e == 0 || e > 1<<63-1 {
		t.Errorf("store.UnixNano(year 9999) = %d, want the largest int64", e)
	}
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	rec := testRecord("1970", store.StateDelivered)
	rec.ReceivedAt = time.Unix(0, 0).UTC()
	rec.ExpiresAt = time.Unix(0, 0).UTC().Add(time.Nanosecond)
	old := testRecord("1", store.StateDelivered)
	old.ExpiresAt = time.Date(1, 1, 1, 12, 0, 0, 0, time.UTC) // year 1, not the zero time ("no TTL")
	for _, r := range []*store.Record{rec, old} {
		if _, err := b.Insert(ctx, r); err != nil {
			t.Fatal(err)
		}
		if got, err := b.Get(ctx, r.Key()); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("record expiring %s: Get = %+v, %v; want it expired (ErrNotFound)", r.ExpiresAt, got, err)
		}
	}
	task := &store.Task{Provider: "captchaai", ID: "42", SubmittedAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), PingbackURL: "http://x/cb",
		State: store.TaskPending, ExpiresAt: time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)}
	if _, err := b.AddTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	if got, err := b.GetTask(ctx, task.Key()); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("task expiring in year 1: GetTask = %+v, %v; want it expired", got, err)
	}
}
