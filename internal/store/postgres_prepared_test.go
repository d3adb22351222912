package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestPostgresBatchStatementsPrepared: the insert and outcome batches'
// statements are prepared once per connection and then run from the
// prepared statement (pgx's statement cache, its default exec mode), not
// parsed and planned from their text each time. On a pool of one
// connection, each batch statement is in pg_prepared_statements once and
// has run once per batch.
func TestPostgresBatchStatementsPrepared(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	p := openPG(t, dsn+sep+"pool_max_conns=1", schema)
	ctx := context.Background()
	const n = 6
	now := time.Now().UTC()
	for i := range n {
		rec := &store.Record{
			Provider: "2captcha", ID: fmt.Sprint(i), Code: "C", Source: store.SourceCallback, ReceivedAt: now,
			Request:   store.Request{Method: "GET", URI: fmt.Sprintf("/pb?id=%d&code=C", i), Host: "example.com"},
			Delivery:  store.Delivery{State: store.StateForwarding, Lease: store.Lease{Owner: "o", Until: now.Add(time.Minute)}, UpdatedAt: now},
			ExpiresAt: now.Add(time.Hour),
		}
		if _, err := p.Insert(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if _, err := p.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
			d.State, d.Lease, d.Attempts, d.LastStatus = store.StateDelivered, store.Lease{}, 1, 200
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := store.PostgresPreparedStatements(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"INSERT INTO records (", "UPDATE tasks t SET state = 'done'", "UPDATE records"} {
		var found []string
		var runs int64
		for s, r := range got {
			if strings.HasPrefix(strings.TrimSpace(s), want) {
				found = append(found, s)
				runs += r
			}
		}
		if len(found) == 0 {
			t.Errorf("no prepared statement starts with %q: the batch statement is not prepared (statements: %d)", want, len(got))
			continue
		}
		if len(found) > 1 {
			t.Errorf("%d prepared statements start with %q: want one, prepared once", len(found), want)
		}
		if runs < n {
			t.Errorf("statements starting with %q ran %d times from their prepared plan: want at least %d (one per batch)", want, runs, n)
		}
	}
}
