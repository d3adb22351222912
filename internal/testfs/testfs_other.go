//go:build !linux

package testfs

import "testing"

const skipReason = "mounting a small filesystem is implemented on Linux only; CI runs on Linux as root"

// Small skips the test: see the Linux version.
func Small(t testing.TB, size int64) string {
	t.Helper()
	t.Skip(skipReason)
	return ""
}

// Free skips the test: see the Linux version.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	t.Skip(skipReason)
	return 0
}

// Fill skips the test: see the Linux version.
func Fill(t testing.TB, dir string, leave int64) func() {
	t.Helper()
	t.Skip(skipReason)
	return func() {}
}
