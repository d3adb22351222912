package badgerstore

// openChecked is Open with the store's self-checks on (Options.SelfCheck),
// as every test of the package opens its stores: each answer of the
// committer's in-memory shortcuts is compared with what Badger holds, and
// the persisted counts with the keys at open.
func openChecked(opts Options) (*Badger, error) {
	opts.SelfCheck = true
	return Open(opts)
}
