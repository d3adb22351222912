package badgerstore

// Available reports whether the store takes writes: false while the free
// space on the filesystem of its directory is below min_free_space (or
// cannot be read), when every write returns ErrUnavailable. It reads the
// free space at most every 100 ms, so it is cheap to call, for example for
// the caddy_pingback_store_available gauge (1 or 0). False once the store
// is closed, and while the journal's last checkpoint failed (until one
// succeeds) or the journal is broken (until the store is opened again);
// otherwise always true when the check is disabled.
func (b *Badger) Available() bool {
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	return !closed && b.space.available() && (b.journal == nil || b.journal.healthy())
}

// FreeBytes returns the free space, in bytes, of the filesystem that holds
// dir (what the min_free_space check reads).
func FreeBytes(dir string) (int64, error) { return defaultStatfs(dir) }
