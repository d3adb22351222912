package pingback

import (
	"os"
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestMain turns on the store's self-checks (store.SelfCheck) for every
// test of the package: each answer of the Badger committer's in-memory
// shortcuts is compared with what Badger holds.
func TestMain(m *testing.M) {
	store.SelfCheck = true
	os.Exit(m.Run())
}
