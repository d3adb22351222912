package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

func openPG(t *testing.T, dsn, schema string) *pgstore.Postgres {
	t.Helper()
	p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: schema})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// twoInstances opens two stores on one new schema, as two instances of
// the plugin share one database.
func twoInstances(t *testing.T) (a, b *pgstore.Postgres) {
	t.Helper()
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	return openPG(t, dsn, schema), openPG(t, dsn, schema)
}

// TestPostgresLeaseByDatabaseClock checks the production clock: leases and
// due times are measured by the database's now(), whatever time the
// instance's claim says (a clock an hour fast or slow changes nothing).
func TestPostgresLeaseByDatabaseClock(t *testing.T) {
	a, b := twoInstances(t)
	ctx := context.Background()
	now := time.Now().UTC()
	rec := &store.Record{
		Provider: "2captcha", ID: "1", Code: "C", Source: store.SourceCallback, ReceivedAt: now,
		Request:   store.Request{Method: "GET", URI: "/pb?id=1&code=C", Host: "example.com"},
		Delivery:  store.Delivery{State: store.StateQueued, DueAt: now, UpdatedAt: now},
		ExpiresAt: now.Add(time.Hour),
	}
	if _, err := a.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	forward := func(d *store.Delivery, lapsed bool) { d.State = store.StateForwarding; d.Attempts++ }
	// A claims with its clock an hour slow: the record is due by the
	// database's clock all the same.
	got, err := a.Claim(ctx, store.ClaimRequest{Now: now.Add(-time.Hour), Limit: 10, Lease: time.Minute, Decide: forward})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim with a slow clock = %d records, %v; want the due record", len(got), err)
	}
	if until := got[0].Lease.Until; until.Before(now.Add(50*time.Second)) || until.After(time.Now().Add(70*time.Second)) {
		t.Errorf("lease until %s: want about a minute from the database's now (%s)", until, now)
	}
	// B claims with its clock two hours fast: A's lease still holds.
	got, err = b.Claim(ctx, store.ClaimRequest{Now: now.Add(2 * time.Hour), Limit: 10, Lease: time.Minute, Decide: forward})
	if err != nil || len(got) != 0 {
		t.Fatalf("claim by an instance whose clock is fast = %d records, %v; want none (the lease holds by the database's clock)", len(got), err)
	}
	// B cannot renew A's lease; A can, relative to the database's clock.
	if err := b.Renew(ctx, rec.Key(), 1, time.Now().Add(time.Hour)); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Renew by another instance: %v, want ErrLeaseLost", err)
	}
	if err := a.Renew(ctx, rec.Key(), 1, time.Now().Add(-time.Second)); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	// Renewed to end a second ago: lapsed by the database's clock, so B
	// takes it over even with its clock an hour slow.
	got, err = b.Claim(ctx, store.ClaimRequest{Now: now.Add(-time.Hour), Limit: 10, Lease: time.Minute, Decide: forward})
	if err != nil || len(got) != 1 || got[0].Lease.Owner != b.Owner() || got[0].Interrupts != 0 || got[0].LastError == "" {
		t.Fatalf("claim of a lapsed lease by another instance = %+v, %v", got, err)
	}
}

// TestPostgresRefusesSynchronousCommitOff: a session whose COMMIT could
// return before the WAL is flushed is refused at open.
func TestPostgresRefusesSynchronousCommitOff(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Skipf("DSN is not a URL: %v", err)
	}
	q := u.Query()
	q.Set("options", "-c synchronous_commit=off")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	_, err = pgstore.Open(pgstore.Options{DSN: u.String(), Schema: schema})
	if err == nil || !strings.Contains(err.Error(), "synchronous_commit is off") {
		t.Fatalf("Open with synchronous_commit=off: %v; want a refusal naming synchronous_commit", err)
	}
	q.Set("options", "-c synchronous_commit=local")
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	p, err := pgstore.Open(pgstore.Options{DSN: u.String(), Schema: schema})
	if err != nil {
		t.Fatalf("Open with synchronous_commit=local: %v", err)
	}
	p.Close()
}

// TestPostgresUnreachable: an unreachable database is retried for
// OpenWait, then the error names host and port, never the password.
func TestPostgresUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	dsn := "postgres://pingback:s3cret-pw@" + addr + "/pingback?sslmode=disable"
	start := time.Now()
	_, err = pgstore.Open(pgstore.Options{DSN: dsn, OpenWait: time.Second})
	took := time.Since(start)
	if err == nil {
		t.Fatal("Open of an unreachable database succeeded")
	}
	if !strings.Contains(err.Error(), addr+"/pingback") || strings.Contains(err.Error(), "s3cret-pw") {
		t.Errorf("error %q: want host:port/database and no password", err)
	}
	if took < time.Second || took > 10*time.Second {
		t.Errorf("gave up after %s, want about OpenWait (1s)", took)
	}
}

// TestPostgresConcurrentMigration: instances starting at the same moment
// on an empty database migrate it once, all of them open.
func TestPostgresConcurrentMigration(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	const n = 6
	var wg sync.WaitGroup
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: schema})
			errs[i] = err
			if err == nil {
				p.Close()
			}
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("instance %d: %v", i, err)
		}
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var rows, max int
	if err := conn.QueryRow(context.Background(), "SELECT count(*), max(version) FROM "+pgx.Identifier{schema, "schema_version"}.Sanitize()).Scan(&rows, &max); err != nil {
		t.Fatal(err)
	}
	if rows != pgstore.SchemaVersion() || max != pgstore.SchemaVersion() {
		t.Errorf("schema_version has %d rows up to %d; want each of the %d versions once", rows, max, pgstore.SchemaVersion())
	}
}

// TestPostgresConcurrentDuplicates: inserts of one key at the same moment
// (group-committed into the same batches, from two handles) store it once;
// every other insert reports the stored record.
func TestPostgresConcurrentDuplicates(t *testing.T) {
	a, b := twoInstances(t)
	ctx := context.Background()
	now := time.Now().UTC()
	const n = 60
	var wg sync.WaitGroup
	var stored, dups atomic.Int64
	start := make(chan struct{})
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			<-start
			res, err := s.Insert(ctx, &store.Record{
				Provider: "2captcha", ID: "42", Code: "C", Source: store.SourceCallback, ReceivedAt: now,
				Request:   store.Request{Method: "GET", URI: "/pb?id=42", Host: "example.com"},
				Delivery:  store.Delivery{State: store.StateForwarding, Attempts: 1, Lease: store.Lease{Until: now.Add(time.Minute)}, UpdatedAt: now},
				ExpiresAt: now.Add(time.Hour),
			})
			switch {
			case err != nil:
				t.Error(err)
			case res.Existing == nil:
				stored.Add(1)
			default:
				dups.Add(1)
				if res.Existing.Key() != (store.Key{Provider: "2captcha", ID: "42"}) || res.Existing.State != store.StateForwarding {
					t.Errorf("duplicate reported %+v", res.Existing)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if stored.Load() != 1 || dups.Load() != n-1 {
		t.Errorf("%d stored and %d duplicates of one key, want 1 and %d", stored.Load(), dups.Load(), n-1)
	}
}

// TestPostgresFairClaimIndex: the claim's fair pass reads the partial index
// records_fair (0008_fair_claims.sql), not the whole due backlog, even when
// most due records failed many times: the query's condition implies the
// index's predicate.
func TestPostgresFairClaimIndex(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	openPG(t, dsn, schema)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		"SET search_path TO " + pgx.Identifier{schema}.Sanitize(),
		// A backlog of 5,000 due records with 5 failures, 20 with one.
		`INSERT INTO records (provider, id, code, source, request, state, failures, due_at, expires_at)
			SELECT 'p', 'b' || g, '', 'callback', '{}', 'failed', 5, g, 9000000000000000000 FROM generate_series(1, 5000) g`,
		`INSERT INTO records (provider, id, code, source, request, state, failures, due_at, expires_at)
			SELECT 'p', 'f' || g, '', 'callback', '{}', 'failed', 1, 5000 + g, 9000000000000000000 FROM generate_series(1, 20) g`,
		"ANALYZE records",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	for _, after := range []bool{false, true} {
		args := []any{int64(6000), []string{}, []string{}, 4, []string{}} // $5: no provider skipped
		if after {
			args = append(args, int64(5001), "p", "f1")
		}
		if text := explain(t, conn, pgstore.FairClaimQuery(after), args...); !strings.Contains(text, "records_fair") {
			t.Errorf("plan of the fair pass (after a row: %v) does not use records_fair:\n%s", after, text)
		}
	}
}

// TestPostgresDeferredOutcomes: the outcomes of live forwards (deferrable
// updates, gathered for pgLazyWait into shared transactions) recorded
// concurrently on a real database are each applied when their call
// returns. (That they are gathered is TestPGBatcherGathersDeferrable's.)
func TestPostgresDeferredOutcomes(t *testing.T) {
	dsn := pgtest.DSN(t)
	p := openPG(t, dsn, pgtest.Schema(t, dsn))
	ctx := context.Background()
	now := time.Now().UTC()
	const n = 40
	for i := range n {
		if _, err := p.Insert(ctx, &store.Record{
			Provider: "2captcha", ID: fmt.Sprint(1000 + i), Code: "C", Source: store.SourceCallback, ReceivedAt: now,
			Request:   store.Request{Method: "GET", URI: "/pb", Host: "example.com"},
			Delivery:  store.Delivery{State: store.StateForwarding, Attempts: 1, Lease: store.Lease{Until: now.Add(time.Minute)}, UpdatedAt: now},
			ExpiresAt: now.Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			_, err := p.UpdateDelivery(store.Deferrable(ctx), store.Key{Provider: "2captcha", ID: fmt.Sprint(1000 + i)}, func(d *store.Delivery) error {
				d.State, d.Lease, d.UpdatedAt = store.StateDelivered, store.Lease{}, now
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	for i := range n {
		rec, err := p.Get(ctx, store.Key{Provider: "2captcha", ID: fmt.Sprint(1000 + i)})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != store.StateDelivered {
			t.Errorf("record %d is %s after its outcome returned, want delivered", 1000+i, rec.State)
		}
	}
}
