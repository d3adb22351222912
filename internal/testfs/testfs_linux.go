//go:build linux

package testfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// skipReason is the reason given when a filesystem cannot be mounted.
const skipReason = "needs root to mount a small filesystem; CI runs as root"

// Small mounts a tmpfs of size bytes (rounded up to whole pages by the
// kernel) in a new directory under t.TempDir() and returns that directory.
// It is unmounted when the test ends (after the test's later cleanups, so a
// store opened on it is closed first). The test is skipped when not run as
// root or when the mount is not permitted (for example in a container
// without CAP_SYS_ADMIN); any other mount failure fails it.
func Small(t testing.TB, size int64) string {
	t.Helper()
	if size <= 0 {
		t.Fatalf("testfs.Small: size must be positive, got %d", size)
	}
	if os.Geteuid() != 0 {
		t.Skip(skipReason)
	}
	dir := filepath.Join(t.TempDir(), "smallfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatalf("testfs.Small: %v", err)
	}
	err := unix.Mount("testfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size))
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		t.Skipf("%s (mount: %v)", skipReason, err)
	}
	if err != nil {
		t.Fatalf("testfs.Small: mounting a %d-byte tmpfs on %s: %v", size, dir, err)
	}
	t.Cleanup(func() {
		err := unix.Unmount(dir, 0)
		if err == nil {
			return
		}
		// Still busy (a child process not yet reaped, a file left
		// open): detach it so that no mount outlives the test.
		if err2 := unix.Unmount(dir, unix.MNT_DETACH); err2 != nil {
			t.Errorf("testfs: unmounting %s: %v; detaching: %v", dir, err, err2)
			return
		}
		t.Logf("testfs: %s was busy at unmount (%v); detached it", dir, err)
	})
	return dir
}

// Free returns the bytes available to an unprivileged writer on the
// filesystem holding dir (statfs Bavail×Bsize), as the store's free-space
// guard reads it.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatalf("testfs: statfs %s: %v", dir, err)
	}
	return int64(st.Bavail) * st.Bsize
}

// Fill writes a filler file in dir until the filesystem holding dir has
// about leave bytes free (within one block), and returns a func that
// removes it again; the func may be called more than once and is also run
// when the test ends. If less than leave is free already, nothing is
// written. A write that finds the filesystem full stops the filling (some
// other writer got there first) rather than failing the test.
func Fill(t testing.TB, dir string, leave int64) (free func()) {
	t.Helper()
	f, err := os.CreateTemp(dir, "testfs-filler-*")
	if err != nil {
		t.Fatalf("testfs.Fill: %v", err)
	}
	name := f.Name()
	var once sync.Once
	free = func() {
		once.Do(func() {
			if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("testfs: removing filler %s: %v", name, err)
			}
		})
	}
	t.Cleanup(free)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i) | 1 // not zero: no filesystem may skip it
	}
	limit := Free(t, dir) // no more is written than was free at the start
	for written := int64(0); ; {
		n := Free(t, dir) - leave
		if n <= 0 {
			break
		}
		n = min(n, int64(len(buf)))
		if written += n; written > limit+int64(len(buf)) {
			f.Close()
			t.Fatalf("testfs.Fill: wrote %d bytes to %s and the free space did not fall to %d", written, name, leave)
		}
		if _, err := f.Write(buf[:n]); err != nil {
			if errors.Is(err, unix.ENOSPC) {
				break
			}
			f.Close()
			t.Fatalf("testfs.Fill: writing %s: %v", name, err)
		}
		if n < int64(len(buf)) {
			// The last, partial write: sync so that the filesystem
			// accounts for it before the next look at the free space.
			if err := f.Sync(); err != nil {
				f.Close()
				t.Fatalf("testfs.Fill: syncing %s: %v", name, err)
			}
		}
	}
	if err := f.Close(); err != nil {
		t.Fatalf("testfs.Fill: closing %s: %v", name, err)
	}
	return free
}
