package badgerstore

import (
	"os"
	"testing"
)

// TestMain turns on the committer's self-checks (SelfCheck) for every test
// of the package: each answer of its in-memory shortcuts is compared with
// what Badger holds.
func TestMain(m *testing.M) {
	SelfCheck = true
	os.Exit(m.Run())
}
