package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// TestPostgresBatchStatementsPrepared: with
// default_query_exec_mode=cache_statement in the DSN (pgx's statement
// cache, for a connection of the store's own), the insert batch's
// statements (the records' insert and the tasks' update) and the outcome
// batch's update are each prepared once per connection and then executed
// as that prepared statement, not parsed again from their text, whatever
// the batch's size. On a pool of one connection, one pingback at a time
// and then many at once, each statement is in pg_prepared_statements
// under one name. Without the parameter (the store's default, exec, which
// works behind a transaction pooler) and with exec, nothing is prepared:
// the check can tell them apart.
func TestPostgresBatchStatementsPrepared(t *testing.T) {
	dsn := pgtest.DSN(t)
	batchStatements := []string{
		"INSERT INTO records (",
		"UPDATE tasks t SET state = 'done'",
		"UPDATE records r SET state = u.state",
	}
	for _, tc := range []struct {
		name, mode string
		prepared   bool
	}{
		{name: "default", prepared: false},
		{name: "exec", mode: "exec", prepared: false},
		{name: "cache_statement", mode: "cache_statement", prepared: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			schema := pgtest.Schema(t, dsn)
			d := withParam(t, dsn, "pool_max_conns", "1")
			if tc.mode != "" {
				d = withParam(t, d, "default_query_exec_mode", tc.mode)
			}
			p := openPG(t, d, schema)
			ctx := context.Background()
			const one, many = 6, 24
			for i := range one {
				insertDelivered(t, p, fmt.Sprint(i))
			}
			var wg sync.WaitGroup
			for i := range many {
				wg.Go(func() { insertDelivered(t, p, fmt.Sprint("c", i)) })
			}
			wg.Wait()
			got, err := pgstore.PreparedStatements(ctx, p)
			if errors.Is(err, errors.ErrUnsupported) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range batchStatements {
				var names []string
				var runs int64
				for name, ps := range got {
					if strings.HasPrefix(strings.TrimSpace(ps.Statement), want) {
						names = append(names, name)
						runs += ps.Runs
					}
				}
				switch {
				case !tc.prepared && len(names) > 0:
					t.Errorf("%d prepared statements start with %q in exec mode: want none", len(names), want)
				case !tc.prepared:
				case len(names) == 0:
					t.Errorf("no prepared statement starts with %q: the batch statement is parsed each time (prepared: %d)", want, len(got))
				case len(names) > 1:
					t.Errorf("%d prepared statements start with %q: want one, prepared once", len(names), want)
				case runs < one+1 || runs > one+many:
					t.Errorf("statements starting with %q were executed %d times as prepared statements: want one per batch, between %d and %d", want, runs, one+1, one+many)
				}
			}
		})
	}
}

// insertDelivered stores a live pingback for id and records its delivery,
// as the handler does: the insert batch, then the outcome batch.
func insertDelivered(t *testing.T, p *pgstore.Postgres, id string) {
	t.Helper()
	ctx := context.Background()
	rec := retryRecord(id, true)
	if _, err := p.Insert(ctx, rec); err != nil {
		t.Error(err)
		return
	}
	if _, err := p.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
		d.State, d.Lease, d.Attempts, d.LastStatus = store.StateDelivered, store.Lease{}, 1, 200
		return nil
	}); err != nil {
		t.Error(err)
	}
}
