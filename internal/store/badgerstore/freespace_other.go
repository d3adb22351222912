//go:build !(linux || darwin || freebsd || dragonfly || windows)

package badgerstore

import "errors"

// haveStatfs is false where the store has no way to read free space: the
// guard is then disabled (newSpaceGuard logs that once).
const haveStatfs = false

// defaultStatfs fails: there is no way to read free space here.
func defaultStatfs(string) (int64, error) { return 0, errors.ErrUnsupported }

// mountPoint is unknown on these platforms.
func mountPoint(string) string { return "" }
