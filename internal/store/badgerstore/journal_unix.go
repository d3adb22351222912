//go:build unix

package badgerstore

import "os"

// syncDir fsyncs a directory, so that the files created in it stay.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
