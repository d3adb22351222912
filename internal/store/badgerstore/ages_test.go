package badgerstore

import (
	"context"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// A store written before the m/live/ keys existed gets its newest live
// pingback of each provider from its records when first opened by this
// version (not from polled ones), once; later opens read the keys.
func TestBadgerSeedsLastLive(t *testing.T) {
	dir := t.TempDir()
	b, err := openChecked(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	older, newer, polled := testRecord("1", store.StateDelivered), testRecord("2", store.StateDelivered), testRecord("3", store.StateDelivered)
	newer.ReceivedAt = t0.Add(time.Minute)
	polled.Source, polled.ReceivedAt = store.SourcePoll, t0.Add(time.Hour)
	for _, r := range []*store.Record{newer, older, polled} {
		if _, err := b.Insert(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if a, _ := b.Ages(ctx); !a.LastCallback["captchaai"].Equal(newer.ReceivedAt) {
		t.Fatalf("LastCallback = %v, want the newer live record's %v", a.LastCallback, newer.ReceivedAt)
	}
	// As a store of the version before: no m/live/ keys, no marker.
	if err := b.db.Update(func(txn *badger.Txn) error {
		if err := txn.Delete([]byte(lastLiveSeeded)); err != nil {
			return err
		}
		return txn.Delete([]byte(lastLivePrefix + "captchaai"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for _, open := range []string{"first open: seeded from the records", "second open: from the key"} {
		b := openTestBadger(t, Options{Dir: dir})
		a, err := b.Ages(ctx)
		if err != nil || !a.LastCallback["captchaai"].Equal(newer.ReceivedAt) {
			t.Errorf("%s: LastCallback = %v, %v; want %v", open, a.LastCallback, err, newer.ReceivedAt)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
