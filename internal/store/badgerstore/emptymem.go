package badgerstore

import (
	"fmt"
	"os"
	"path/filepath"
)

// removeEmptyMemtables deletes the empty memtable logs (*.mem of 0 bytes)
// in dir before Badger opens it. Badger creates a memtable's log, then
// sizes it and writes its header; a process killed between the two
// leaves a 0-byte file that holds no write, and Badger v4 refuses to open
// the directory over it ("while opening fid: N err: Create a new file").
// A log with any bytes is left to Badger's own recovery.
func removeEmptyMemtables(dir string) error {
	mems, err := filepath.Glob(filepath.Join(dir, "*.mem"))
	if err != nil {
		return err
	}
	for _, m := range mems {
		fi, err := os.Lstat(m)
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != 0 {
			continue
		}
		if err := os.Remove(m); err != nil {
			return fmt.Errorf("removing the empty memtable log %s: %w", m, err)
		}
	}
	return nil
}
