//go:build !linux

package badgerstore

import "os"

// syncData makes the file's data durable: fsync (F_FULLFSYNC on macOS,
// FlushFileBuffers on Windows).
func syncData(f *os.File) error { return f.Sync() }
