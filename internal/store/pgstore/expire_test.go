package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestPostgresExpireDeliveredBeyondLimit: one Expire call forgets every
// expired delivered record, however many there are beyond its limit,
// since only the undelivered are reported and the app's housekeeping stops
// once a call reports fewer than its limit. Before, a call deleted at most
// limit rows of any state, so a store taking more than 1,000 results a
// minute (17 a second) grew without end (bench/steady.sh: 24,000 → 90,000
// records in 8 minutes at 200/s with retention 2m).
func TestPostgresExpireDeliveredBeyondLimit(t *testing.T) {
	dsn := pgtest.DSN(t)
	p := openPG(t, dsn, pgtest.Schema(t, dsn))
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Second)
	end := now.Add(time.Hour)
	rec := func(id string, st store.State, expires time.Time) *store.Record {
		return &store.Record{
			Provider: "2captcha", ID: id, Code: "C" + id, Source: store.SourceCallback, ReceivedAt: now,
			Request:   store.Request{Method: "POST", URI: "/pb", Host: "example.com", Body: []byte("id=" + id + "&code=C")},
			Delivery:  store.Delivery{State: st, UpdatedAt: now, LastStatus: 200},
			ExpiresAt: expires,
		}
	}
	const delivered, parked, limit = 45, 3, 10
	var ids []string
	for i := range delivered {
		ids = append(ids, fmt.Sprintf("d%02d", i))
	}
	for i := range parked {
		ids = append(ids, fmt.Sprintf("p%d", i))
	}
	for _, id := range ids {
		st := store.StateDelivered
		if id[0] == 'p' {
			st = store.StateParked
		}
		if _, err := p.Insert(ctx, rec(id, st, end)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Insert(ctx, rec("later", store.StateDelivered, end.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}

	gone, err := p.Expire(ctx, end, limit)
	if err != nil {
		t.Fatal(err)
	}
	reported := map[string]store.State{}
	for _, e := range gone {
		reported[e.Key.ID] = e.State
	}
	if len(reported) != parked || reported["p0"] != store.StateParked || reported["p1"] != store.StateParked || reported["p2"] != store.StateParked {
		t.Errorf("Expire reported %v, want the %d parked records", reported, parked)
	}
	for _, id := range ids {
		if _, err := p.Get(ctx, store.Key{Provider: "2captcha", ID: id}); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(%s) after one Expire call: %v, want ErrNotFound (its retention ended)", id, err)
		}
	}
	if _, err := p.Get(ctx, store.Key{Provider: "2captcha", ID: "later"}); err != nil {
		t.Errorf("Get(later), whose retention has not ended: %v", err)
	}
	if gone, err := p.Expire(ctx, end, limit); err != nil || len(gone) != 0 {
		t.Errorf("a second Expire = %v, %v; want nothing", gone, err)
	}
}
