//go:build windows

package badgerstore

import (
	"math"
	"path/filepath"

	"golang.org/x/sys/windows"
)

// haveStatfs: this platform reads free space.
const haveStatfs = true

// defaultStatfs is GetDiskFreeSpaceEx: the bytes available to this
// process's user on the volume of dir (quotas included).
func defaultStatfs(dir string) (int64, error) {
	p, err := windows.UTF16PtrFromString(dir)
	if err != nil {
		return 0, err
	}
	var avail, total, totalFree uint64
	if err := windows.GetDiskFreeSpaceEx(p, &avail, &total, &totalFree); err != nil {
		return 0, err
	}
	if avail > math.MaxInt64 {
		return math.MaxInt64, nil
	}
	return int64(avail), nil
}

// mountPoint returns the volume of abs, such as `C:\`.
func mountPoint(abs string) string {
	if v := filepath.VolumeName(abs); v != "" {
		return v + `\`
	}
	return ""
}
