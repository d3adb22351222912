package testfs

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Unpack extracts the regular files under the folder top of a .tar.gz
// fixture (such as a store written by an earlier format) into a new
// temporary directory and returns that directory. Files outside top, and
// anything but regular files and folders, are skipped.
func Unpack(t testing.TB, archive, top string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", archive, err)
	}
	dir := t.TempDir()
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return dir
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		name, ok := strings.CutPrefix(filepath.ToSlash(filepath.Clean(h.Name)), top+"/")
		if !ok || name == "" || strings.HasPrefix(name, "../") {
			continue
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(target, 0o700)
		case tar.TypeReg:
			err = writeFile(target, tr)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func writeFile(path string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	out, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
