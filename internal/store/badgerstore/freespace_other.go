//go:build !(linux || darwin || freebsd || dragonfly || windows)

package badgerstore

// defaultStatfs is nil where the store has no way to read free space: the
// guard is then disabled (newSpaceGuard logs that once).
var defaultStatfs statfsFunc

// mountPoint is unknown on these platforms.
func mountPoint(string) string { return "" }
