package badgerstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// BenchmarkListPage measures one page of 100 from a Badger store of n
// results (1 % parked, two providers): the first page, a page in the
// middle (by cursor), one provider's and the parked ones'. A page should
// cost the same whatever n is.
func BenchmarkListPage(b *testing.B) {
	for _, n := range []int{10000, 100000} {
		s := openTestBadger(b, Options{Dir: b.TempDir()})
		concurrently(b, n, func(i int) error {
			st := store.StateDelivered
			if i%100 == 0 {
				st = store.StateParked
			}
			r := testRecord(fmt.Sprint(i), st)
			r.ReceivedAt = r.ReceivedAt.Add(-time.Duration(n-i) * time.Millisecond)
			if i%2 == 0 {
				r.Provider = "2captcha"
			}
			_, err := s.Insert(ctx, r)
			return err
		})
		mid, err := s.ListPage(ctx, store.ListQuery{Limit: n / 2})
		if err != nil {
			b.Fatal(err)
		}
		for _, q := range []struct {
			name string
			q    store.ListQuery
		}{
			{"first", store.ListQuery{Limit: 100}},
			{"middle", store.ListQuery{Limit: 100, After: mid.Next}},
			{"provider", store.ListQuery{Limit: 100, Provider: "2captcha", After: mid.Next}},
			{"parked", store.ListQuery{Limit: 100, State: store.StateParked}},
		} {
			b.Run(fmt.Sprintf("n=%d/%s", n, q.name), func(b *testing.B) {
				for b.Loop() {
					p, err := s.ListPage(ctx, q.q)
					if err != nil || len(p.Records) != 100 {
						b.Fatalf("%d records, %v", len(p.Records), err)
					}
				}
			})
		}
	}
}

// A correction moves the record's received time and expiry: its i/ entry
// follows (ListPage orders by it, and it expires with the record).
func TestUpdateRecordMovesTheReceivedIndex(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	k := key("corrected")
	if _, err := b.Insert(ctx, testRecord(k.ID, store.StateDelivered)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.UpdateRecord(ctx, k, func(r *store.Record) error {
		r.ReceivedAt, r.ExpiresAt = t0.Add(time.Minute), t0.Add(40*24*time.Hour)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := CheckIndexes(b); err != nil {
		t.Error(err)
	}
}
