package badgerstore

import (
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// A store of format 2 had no state index: opening it builds one, so that
// List by state finds its queued, failed, rejected and parked records.
func TestBadgerFormat2StateIndex(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	mustInsert(t, b, testRecord("q", store.StateQueued), testRecord("f", store.StateFailed), testRecord("p", store.StateParked),
		testRecord("r", store.StateRejected), testRecord("w", store.StateForwarding))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Make it a store of format 2: no v/ entries.
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(txn *badger.Txn) error {
		for _, s := range []string{"queued/captchaai/q", "failed/captchaai/f", "parked/captchaai/p", "rejected/captchaai/r"} {
			if err := txn.Delete([]byte(statePrefix + s)); err != nil {
				return err
			}
		}
		return txn.Set([]byte(metaFormatKey), []byte("2"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	b = openTestBadger(t, Options{Dir: dir})
	checkIndexesOK(t, b)
	for st, want := range map[store.State]string{store.StateQueued: "q", store.StateFailed: "f", store.StateParked: "p", store.StateRejected: "r", store.StateForwarding: "w", store.StateDelivered: ""} {
		recs, err := b.List(ctx, store.Filter{State: st}, 10)
		if err != nil || recIDs(recs) != want {
			t.Errorf("List(%s) = %q, %v; want %q", st, recIDs(recs), err, want)
		}
		recs, err = b.List(ctx, store.Filter{Provider: "2captcha", State: st}, 10)
		if err != nil || len(recs) != 0 {
			t.Errorf("List(2captcha, %s) = %q, %v; want none", st, recIDs(recs), err)
		}
	}
}
