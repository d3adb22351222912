package store

import (
	"os"
	"path/filepath"
)

// memTableOfLogs is the MemTableSize the memtable logs (*.mem) in dir were
// created with, 0 if there are none. Badger creates each log at twice its
// MemTableSize (sparse) and keeps that size when it reopens the file, and
// it replays a log into a memtable of the size it is opened with: a log
// holding more than that makes Open panic ("Arena too small").
func memTableOfLogs(dir string) int64 {
	logs, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
	var n int64
	for _, name := range logs {
		if fi, err := os.Stat(name); err == nil {
			n = max(n, fi.Size()/2)
		}
	}
	return n
}
