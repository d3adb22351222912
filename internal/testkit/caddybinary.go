package testkit

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// caddyPackage is the main package CaddyBinary builds: Caddy with the
// plugin (and its drill) registered.
const caddyPackage = "github.com/caddy-pingback/pingback/cmd/caddy"

// caddyBinary is the built binary, once per test binary.
var caddyBinary struct {
	once sync.Once
	path string
	err  error
}

// CaddyBinary builds the module's ./cmd/caddy on its first call in a test
// binary and returns the binary's path; a failed build fails t (and every
// later call). Under the race detector (RaceEnabled) the binary is built
// with -race too, so the child processes a test starts are checked as well.
// The binary lives in the user's cache directory (the system temp
// directory if there is none), one per checkout and race mode (named after
// a hash of the module's directory, with a -race suffix), and is replaced
// atomically, so test runs of other checkouts or of other packages never
// see a half-written file.
func CaddyBinary(t testing.TB) string {
	t.Helper()
	caddyBinary.once.Do(func() {
		start := time.Now()
		caddyBinary.path, caddyBinary.err = buildCaddy()
		if caddyBinary.err == nil {
			t.Logf("built %s in %s", caddyBinary.path, time.Since(start).Round(time.Millisecond))
		}
	})
	if caddyBinary.err != nil {
		t.Fatalf("building the caddy binary: %v", caddyBinary.err)
	}
	return caddyBinary.path
}

// buildCaddy builds caddyPackage into a temp file of the cache directory
// and renames it to the checkout's binary.
func buildCaddy() (string, error) {
	module, err := moduleDir()
	if err != nil {
		return "", err
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "caddy-pingback-test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, "caddy-*.tmp")
	if err != nil {
		return "", err
	}
	_ = tmp.Close()
	defer os.Remove(tmp.Name()) // a no-op once renamed
	args := []string{"build", "-o", tmp.Name()}
	if RaceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, caddyPackage)...)
	cmd.Dir = module
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
	}
	name := fmt.Sprintf("caddy-%x", sha256.Sum256([]byte(module)))[:len("caddy-")+16]
	if RaceEnabled {
		name += "-race"
	}
	final := filepath.Join(dir, name)
	if err := os.Rename(tmp.Name(), final); err != nil {
		return "", err
	}
	return final, nil
}

// moduleDir is the directory of the go.mod above the working directory
// (a test runs in its package's directory).
func moduleDir() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
