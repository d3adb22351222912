package drill

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// binDir holds the caddy binary the tests build, for this test binary's
// run only.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pingback-drill-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// built is the module's ./cmd/caddy, built at most once per test binary.
var built struct {
	once sync.Once
	path string
	err  error
}

// caddyBinary builds the module's ./cmd/caddy (the plugin with the drill
// registered as `caddy pingback drill`) on first use and returns its path.
func caddyBinary(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		path := filepath.Join(binDir, "caddy")
		out, err := exec.Command("go", "build", "-o", path, "github.com/caddy-pingback/pingback/cmd/caddy").CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
			return
		}
		built.path = path
	})
	if built.err != nil {
		t.Fatalf("building the caddy binary: %v", built.err)
	}
	return built.path
}
