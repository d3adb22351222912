package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// foldSite is a store on a fresh schema whose deferrable updates wait for
// an insert batch as long as it takes (no timer hands them over), with a
// record "A" stored forwarding, and a connection on the same schema.
type foldSite struct {
	dsn, schema string
	p           *store.Postgres
	conn        *pgx.Conn
}

func newFoldSite(t *testing.T) *foldSite {
	t.Helper()
	dsn := pgtest.DSN(t)
	s := &foldSite{dsn: dsn, schema: pgtest.Schema(t, dsn)}
	s.p = openPG(t, dsn, s.schema)
	store.SetPostgresFoldWait(s.p, time.Hour)
	if _, err := s.p.Insert(context.Background(), retryRecord("A", true)); err != nil {
		t.Fatal(err)
	}
	s.conn = pgConn(t, dsn, s.schema)
	return s
}

// xmin is the transaction that last wrote id's row.
func (s *foldSite) xmin(t *testing.T, id string) uint32 {
	t.Helper()
	var x uint32
	if err := s.conn.QueryRow(context.Background(), `SELECT xmin::text::bigint FROM records WHERE provider = '2captcha' AND id = $1`, id).Scan(&x); err != nil {
		t.Fatalf("xmin of %s: %v", id, err)
	}
	return x
}

// deliverLater records id's outcome (delivered, one more attempt) as a
// live forward does, deferrable, and waits until it sits in the fold; the
// channel gets the call's error.
func deliverLater(t *testing.T, p *store.Postgres, id string) <-chan error {
	t.Helper()
	res := make(chan error, 1)
	go func() {
		_, err := p.UpdateDelivery(store.Deferrable(context.Background()), store.Key{Provider: "2captcha", ID: id}, func(d *store.Delivery) error {
			d.State, d.Lease, d.LastStatus = store.StateDelivered, store.Lease{}, 200
			d.Attempts++
			return nil
		})
		res <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "the outcome waiting in the fold", func() bool { return store.PostgresFoldWaiting(p) == 1 })
	return res
}

// outcomeErr waits for an outcome's call to return.
func outcomeErr(t *testing.T, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the outcome never returned")
		return nil
	}
}

func stateOf(t *testing.T, p *store.Postgres, id string) store.State {
	t.Helper()
	rec, err := p.Get(context.Background(), store.Key{Provider: "2captcha", ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

// TestPostgresOutcomeRidesWithInsert: a live forward's outcome is written
// in the next insert's transaction (one transaction for both rows) and
// its call returns once that commits.
func TestPostgresOutcomeRidesWithInsert(t *testing.T) {
	s := newFoldSite(t)
	p := s.p
	res := deliverLater(t, p, "A")
	if _, err := p.Insert(context.Background(), retryRecord("B", true)); err != nil {
		t.Fatal(err)
	}
	if err := outcomeErr(t, res); err != nil {
		t.Fatalf("outcome: %v", err)
	}
	if s := stateOf(t, p, "A"); s != store.StateDelivered {
		t.Errorf("A is %s after its outcome returned, want delivered", s)
	}
	if a, b := s.xmin(t, "A"), s.xmin(t, "B"); a != b {
		t.Errorf("A's outcome was written by transaction %d, B's insert by %d: want one transaction", a, b)
	}
	if n := store.PostgresCarried(p); n != 1 {
		t.Errorf("insert batches carried %d outcomes, want 1", n)
	}
}

// TestPostgresLockedOutcomeDoesNotHoldInsert: an insert batch does not wait
// for an outcome's row that another transaction holds (an admin action,
// another instance): the insert commits at once, and the outcome is
// applied on its own once the row is free.
func TestPostgresLockedOutcomeDoesNotHoldInsert(t *testing.T) {
	s := newFoldSite(t)
	p, ctx := s.p, context.Background()
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM records WHERE provider = '2captcha' AND id = 'A' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	res := deliverLater(t, p, "A")
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := p.Insert(ictx, retryRecord("B", true)); err != nil {
		t.Fatalf("insert while the outcome's row is locked elsewhere: %v", err)
	}
	select {
	case err := <-res:
		t.Fatalf("the outcome returned (%v) while its row was still locked", err)
	default:
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := outcomeErr(t, res); err != nil {
		t.Fatalf("outcome after the row was freed: %v", err)
	}
	if s := stateOf(t, p, "A"); s != store.StateDelivered {
		t.Errorf("A is %s, want delivered", s)
	}
	if n := store.PostgresCarried(p); n != 0 {
		t.Errorf("insert batches carried %d outcomes, want 0 (the row was locked)", n)
	}
}

// TestPostgresFailingOutcomeKeepsInsert: an outcome whose write the
// database refuses fails the insert transaction that carried it; the
// insert is stored all the same (run again without it) and the outcome
// gets the database's error from a transaction of its own.
func TestPostgresFailingOutcomeKeepsInsert(t *testing.T) {
	s := newFoldSite(t)
	p, ctx := s.p, context.Background()
	for _, stmt := range []string{
		`CREATE FUNCTION refuse_a() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'test refuses updates of A'; END $$`,
		`CREATE TRIGGER refuse_a BEFORE UPDATE ON records FOR EACH ROW WHEN (OLD.id = 'A') EXECUTE FUNCTION refuse_a()`,
	} {
		if _, err := s.conn.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	res := deliverLater(t, p, "A")
	if _, err := p.Insert(ctx, retryRecord("B", true)); err != nil {
		t.Fatalf("insert carrying a refused outcome: %v", err)
	}
	if s := stateOf(t, p, "B"); s != store.StateForwarding {
		t.Errorf("B is %s, want forwarding (stored)", s)
	}
	err := outcomeErr(t, res)
	if err == nil || !strings.Contains(err.Error(), "test refuses updates of A") {
		t.Errorf("outcome error %v: want the database's refusal", err)
	}
	if s := stateOf(t, p, "A"); s != store.StateForwarding {
		t.Errorf("A is %s, want forwarding (its outcome refused)", s)
	}
}

// TestPostgresCloseRunsWaitingOutcomes: an outcome waiting for an insert
// when the store closes is written before Close returns.
func TestPostgresCloseRunsWaitingOutcomes(t *testing.T) {
	s := newFoldSite(t)
	p := s.p
	res := deliverLater(t, p, "A")
	p.Close()
	if err := outcomeErr(t, res); err != nil {
		t.Fatalf("outcome waiting at Close: %v", err)
	}
	again := openPG(t, s.dsn, s.schema)
	if s := stateOf(t, again, "A"); s != store.StateDelivered {
		t.Errorf("A is %s after Close, want delivered", s)
	}
	if _, err := again.UpdateDelivery(store.Deferrable(context.Background()), store.Key{Provider: "2captcha", ID: "A"}, func(*store.Delivery) error { return nil }); err != nil {
		t.Errorf("a deferrable update on a store with no inserts: %v", err)
	}
	if _, err := p.UpdateDelivery(store.Deferrable(context.Background()), store.Key{Provider: "2captcha", ID: "A"}, func(*store.Delivery) error { return nil }); !errors.Is(err, store.ErrClosed) {
		t.Errorf("a deferrable update after Close: %v, want ErrClosed", err)
	}
}

// TestPostgresFoldDeadlockFree: two instances on one database, each with
// pingbacks stored and their outcomes recorded at once (outcomes riding
// in inserts, outcomes on their own, inserts alone, all mixed), cause no
// deadlock: a transaction that writes both new records and outcomes
// takes the record count rows (which the count triggers lock, per backend
// shard) in the same order as one that writes either.
func TestPostgresFoldDeadlockFree(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	a, b := openPG(t, dsn, schema), openPG(t, dsn, schema)
	conn := pgConn(t, dsn, schema)
	ctx := context.Background()
	deadlocks := func() int64 {
		var n int64
		if err := conn.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := deadlocks()
	const workers, each = 16, 40
	var wg sync.WaitGroup
	for w := range workers {
		p := []*store.Postgres{a, b}[w%2]
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := p.Insert(ctx, retryRecord(id, true)); err != nil {
					t.Errorf("insert %s: %v", id, err)
					return
				}
				final := store.StateDelivered
				if i%3 == 0 {
					final = store.StateFailed
				}
				octx := store.Deferrable(ctx) // a live forward's outcome
				if i%2 == 1 {
					octx = ctx // a replay's, in a transaction of its own
				}
				if _, err := p.UpdateDelivery(octx, store.Key{Provider: "2captcha", ID: id}, func(d *store.Delivery) error {
					d.State, d.Lease = final, store.Lease{}
					return nil
				}); err != nil {
					t.Errorf("outcome %s: %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := deadlocks() - before; n != 0 {
		t.Errorf("%d deadlocks detected in the database during the run", n)
	}
	if store.PostgresCarried(a)+store.PostgresCarried(b) == 0 {
		t.Error("no outcome rode in an insert: the case was not tested")
	}
}

// TestPostgresFoldLockPlan: the query by which an insert batch locks the
// rows of the outcomes it carries probes the primary key even in a generic
// plan made while the records table is empty and never analyzed, as on a
// new store (a semi-join over the keys would scan the table on the
// pingback's path).
func TestPostgresFoldLockPlan(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	openPG(t, dsn, schema)
	conn := pgConn(t, dsn, schema)
	if _, err := conn.Exec(context.Background(), `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	plan := explain(t, conn, store.PostgresFoldLockQuery, []string{"2captcha", "2captcha"}, []string{"1", "2"})
	if !strings.Contains(plan, "Index Scan using records_pkey") || strings.Contains(plan, "Seq Scan on records") {
		t.Errorf("generic plan of the fold's lock on an empty table does not probe records_pkey:\n%s", plan)
	}
}
