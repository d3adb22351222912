package pgstore_test

import (
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
	"github.com/caddy-pingback/pingback/internal/store/storetest"
)

// TestPostgresConformance runs the Store conformance suite on PostgreSQL
// stores, each in its own schema of the test database. The suite injects
// every time; the store's clock (the database's now() in production) is
// set to each claim's time.
func TestPostgresConformance(t *testing.T) {
	dsn := pgtest.DSN(t)
	runPostgresConformance(t, dsn, dsn)
}

// TestPostgresConformanceBehindPgBouncer runs the same suite through
// PgBouncer in transaction pooling with its stock settings: each
// transaction may get another server connection, shared with the other
// stores of the suite.
func TestPostgresConformanceBehindPgBouncer(t *testing.T) {
	direct := pgtest.DSN(t)
	bounced, _ := pgtest.StartPgBouncer(t, direct, "transaction")
	runPostgresConformance(t, bounced, direct)
}

// runPostgresConformance runs the suite on stores opened with dsn; direct
// reaches the same database without a pooler (the schemas' clean-up).
func runPostgresConformance(t *testing.T, dsn, direct string) {
	var mu sync.Mutex
	clocks := map[store.Store]*time.Time{}
	open := func(t *testing.T, term time.Duration) store.Store {
		t.Helper()
		p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: pgtest.Schema(t, direct), LeaseTerm: term})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		now := new(time.Time)
		*now = time.Now().Add(time.Hour)
		pgstore.SetClock(p, func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return *now
		})
		mu.Lock()
		clocks[p] = now
		mu.Unlock()
		t.Cleanup(func() {
			if err := p.Close(); err != nil {
				t.Errorf("closing the store: %v", err)
			}
		})
		return p
	}
	storetest.Run(t, storetest.Harness{
		Open:          func(t *testing.T) store.Store { return open(t, 0) },
		OpenLeaseTerm: open,
		SetClock: func(s store.Store, now time.Time) {
			mu.Lock()
			defer mu.Unlock()
			*clocks[s] = now
		},
		ExpiredReason: "interrupted: lease expired before the forward reported",
	})
}
