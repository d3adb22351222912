package badgerstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// The modes of the Badger store's directory and files: only the user
// Caddy runs as may read the results (codes, requests) or list them.
const (
	dirMode  fs.FileMode = 0o700
	fileMode fs.FileMode = 0o600
)

// isStoreFile reports whether name is one of the files a Badger store
// keeps in its directory: Badger's own (MANIFEST, KEYREGISTRY, LOCK,
// DISCARD, their rewrite files, *.sst tables, *.vlog value logs, *.mem
// memtable logs; the names are those of Badger v4.9.6's source,
// https://github.com/dgraph-io/badger/blob/v4.9.6/) and the journal's
// (pingback-journal.0, .1 and .ckpt).
func isStoreFile(name string) bool {
	switch name {
	case "MANIFEST", "MANIFEST-REWRITE", "KEYREGISTRY", "REWRITE-KEYREGISTRY", "LOCK", "DISCARD",
		journalName + ".0", journalName + ".1", journalName + ".ckpt":
		return true
	}
	for _, ext := range []string{".sst", ".vlog", ".mem"} {
		if stem, ok := strings.CutSuffix(name, ext); ok && stem != "" && strings.Trim(stem, "0123456789") == "" {
			return true
		}
	}
	return false
}

// secureStoreDir creates dir (mode 0700) if it does not exist, and makes
// an existing one private: the directory 0700 and each of its files 0600,
// whatever their modes were. It refuses (a clear error, nothing changed)
// a directory that holds anything but the store's files (isStoreFile: a
// foreign file, a subdirectory, a symbolic link): its modes are not the
// store's to change, and the results would share it with others. A mode
// that cannot be changed (a directory of another user) is an error too.
// On Windows, where modes do not control access, only the contents are
// checked.
func secureStoreDir(dir string) error {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("creating storage directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading storage directory %s: %w", dir, err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !isStoreFile(e.Name()) {
			return fmt.Errorf("storage directory %s holds %q, which is not one of the store's files: give the store a directory of its own (new, empty, or holding only its files), whose mode it makes 0700 and its files' 0600", dir, e.Name())
		}
	}
	if runtime.GOOS == "windows" {
		return nil
	}
	if err := os.Chmod(dir, dirMode); err != nil {
		return fmt.Errorf("making storage directory %s private (mode 0700): %w", dir, err)
	}
	return privateFiles(dir)
}

// privateFiles makes every store file in dir mode 0600. Badger creates
// some of its files 0666 less the umask (its LOCK file, memtable logs and
// tables: usually 0644); inside the 0700 directory nobody else can reach
// them, and this makes them private besides. Called at open and at each
// journal checkpoint. A file removed meanwhile is skipped.
func privateFiles(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || !isStoreFile(e.Name()) {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if info.Mode().Perm() == fileMode {
			continue
		}
		err = os.Chmod(filepath.Join(dir, e.Name()), fileMode)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("making %s private (mode 0600): %w", filepath.Join(dir, e.Name()), err)
		}
	}
	return nil
}
