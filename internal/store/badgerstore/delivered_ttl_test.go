package badgerstore

import (
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
	badger "github.com/dgraph-io/badger/v4"
)

// TestDeliveredStateExpiresWithItsRecord checks the TTL of a delivered
// result's state (s/): its record's expiry, not an hour later, so that at
// a short retention the states do not pile up (TestDiskLevelsOff); and
// that the record's expiry read back is the same whether its state was
// written so or, by an earlier version, with the grace: the counts move
// by it when the state changes.
func TestDeliveredStateExpiresWithItsRecord(t *testing.T) {
	b, err := Open(Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	k := key("ttl")
	rec := testRecord(k.ID, store.StateForwarding)
	if _, err := b.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if _, err := b.UpdateDelivery(ctx, k, func(d *store.Delivery) error {
		d.State, d.LastStatus = store.StateDelivered, 200
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := expiry(rec.ExpiresAt)
	// read: the TTL of s/ and the record's expiry delivery() reports.
	read := func() (ttl, exp uint64) {
		t.Helper()
		if err := b.view(func(txn *badger.Txn) error {
			item, err := txn.Get(deliveryKey(k))
			if err != nil {
				return err
			}
			ttl = item.ExpiresAt()
			_, exp, err = (&batch{txn: txn}).delivery(k)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return ttl, exp
	}
	if ttl, exp := read(); ttl != want || exp != want {
		t.Errorf("delivered: s/ TTL %d, expiry read %d; want both the record's %d", ttl, exp, want)
	}

	// The state as an earlier version wrote it: the grace added.
	if err := b.submit(ctx, &op{apply: func(w *batch) error {
		d, _, err := w.delivery(k)
		if err != nil {
			return err
		}
		w.set(deliveryKey(k), encodeDelivery(&d), graced(want))
		return nil
	}}); err != nil {
		t.Fatal(err)
	}
	if ttl, exp := read(); ttl != graced(want) || exp != want {
		t.Errorf("delivered by an earlier version: s/ TTL %d, expiry read %d; want %d and the record's %d", ttl, exp, graced(want), want)
	}

	// A replay by hand moves it out of delivered: the state gets the
	// grace again, and the count moves by the record's expiry.
	if _, err := b.UpdateDelivery(ctx, k, func(d *store.Delivery) error {
		d.State, d.DueAt = store.StateFailed, rec.ReceivedAt
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if ttl, exp := read(); ttl != graced(want) || exp != want {
		t.Errorf("failed again: s/ TTL %d, expiry read %d; want %d and the record's %d", ttl, exp, graced(want), want)
	}
	c, err := b.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Records["captchaai"]; got[store.StateFailed] != 1 || got[store.StateDelivered] != 0 {
		t.Errorf("counts %v, want 1 failed and none delivered", got)
	}
}
