//go:build linux || darwin || freebsd || dragonfly

package badgerstore

import (
	"math"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// haveStatfs: this platform reads free space.
const haveStatfs = true

// defaultStatfs is statfs(2): the blocks available to an unprivileged
// writer times the block size. Blocks reserved for root are not counted, so
// the guard trips before a root-run Caddy would really run out.
func defaultStatfs(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	avail, bsize := uint64(st.Bavail), uint64(st.Bsize)
	if bsize != 0 && avail > math.MaxInt64/bsize {
		return math.MaxInt64, nil
	}
	return int64(avail * bsize), nil
}

// mountPoint returns the top directory of the filesystem holding abs (an
// absolute path): the last ancestor on the same device. "" if abs cannot
// be examined.
func mountPoint(abs string) string {
	var st unix.Stat_t
	if err := unix.Stat(abs, &st); err != nil {
		return ""
	}
	dev, dir := st.Dev, abs
	for {
		parent := filepath.Dir(dir)
		if parent == dir {
			return dir
		}
		if err := unix.Stat(parent, &st); err != nil || st.Dev != dev {
			return dir
		}
		dir = parent
	}
}
