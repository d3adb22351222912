//go:build !unix

package store

// syncDir is a no-op where directories cannot be synced (Windows).
func syncDir(string) error { return nil }
