package testkit

import (
	"os"
	"strings"
	"testing"
)

// LogTail logs (t.Logf) the last n lines of the log file, for a failed
// test; a file it cannot read is said instead.
func LogTail(t testing.TB, file string, n int) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Logf("reading the Caddy log: %v", err)
		return
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	t.Logf("last %d lines of the Caddy log:\n%s", min(n, len(lines)), strings.Join(lines[max(0, len(lines)-n):], "\n"))
}
