package testfs

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FilesContaining lists the names of the files under dir (recursively)
// whose bytes contain marker: how the purge tests check that erased data
// left a store's files. A file removed while it is walked is left out.
func FilesContaining(t testing.TB, dir string, marker []byte) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if errors.Is(err, os.ErrNotExist) {
			return nil // removed meanwhile (a compaction, a checkpoint)
		}
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if bytes.Contains(b, marker) {
			out = append(out, filepath.Base(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
