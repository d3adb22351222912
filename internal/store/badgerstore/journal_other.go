//go:build !unix

package badgerstore

// syncDir is a no-op where directories cannot be synced (Windows).
func syncDir(string) error { return nil }
