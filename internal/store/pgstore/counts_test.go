package pgstore_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// countedWrites installs, on the count tables of schema, a row trigger
// that notes each row version written (insert or update) in count_writes,
// and returns a function that reads the notes by table.
func countedWrites(t *testing.T, dsn, schema string) func() map[string]int64 {
	t.Helper()
	ctx := context.Background()
	conn := pgConn(t, dsn, schema)
	if _, err := conn.Exec(ctx, `CREATE TABLE count_writes (tbl text NOT NULL);
		CREATE FUNCTION note_count_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO count_writes VALUES (TG_TABLE_NAME);
			RETURN NULL;
		END $$;
		CREATE TRIGGER note AFTER INSERT OR UPDATE ON record_totals FOR EACH ROW EXECUTE FUNCTION note_count_write();
		CREATE TRIGGER note AFTER INSERT OR UPDATE ON record_counts FOR EACH ROW EXECUTE FUNCTION note_count_write();
		CREATE TRIGGER note AFTER INSERT OR UPDATE ON task_counts FOR EACH ROW EXECUTE FUNCTION note_count_write();`); err != nil {
		t.Fatal(err)
	}
	return func() map[string]int64 {
		t.Helper()
		rows, err := conn.Query(ctx, `SELECT tbl, count(*) FROM count_writes GROUP BY tbl`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var tbl string
			var n int64
			if err := rows.Scan(&tbl, &n); err != nil {
				t.Fatal(err)
			}
			out[tbl] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
}

// TestPostgresCountRowVersions: a pingback forwarded once and delivered
// writes one count-row version (its insert's total), not one per state it
// passes through; one that completes a tracked task writes one more (the
// task leaving pending); a failure and its replay write the failed state's
// row. The counts stay exact throughout.
func TestPostgresCountRowVersions(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	p := openPG(t, dsn, schema)
	writes := countedWrites(t, dsn, schema)
	ctx := context.Background()
	now := time.Now().UTC()
	rec := func(id string) *store.Record {
		return &store.Record{
			Provider: "2captcha", ID: id, Code: "C", Source: store.SourceCallback, ReceivedAt: now,
			Request:   store.Request{Method: "GET", URI: "/pb", Host: "example.com"},
			Delivery:  store.Delivery{State: store.StateForwarding, Attempts: 1, Lease: store.Lease{Until: now.Add(time.Minute)}, UpdatedAt: now},
			ExpiresAt: now.Add(time.Hour),
		}
	}
	setState := func(id string, st store.State) {
		t.Helper()
		if _, err := p.UpdateDelivery(ctx, store.Key{Provider: "2captcha", ID: id}, func(d *store.Delivery) error {
			d.State, d.UpdatedAt = st, now
			d.Lease = store.Lease{}
			if st == store.StateForwarding {
				d.Lease = store.Lease{Until: now.Add(time.Minute)}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	counts := func(want map[store.State]int64, pending int64) {
		t.Helper()
		c, err := p.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !maps.Equal(c.Records["2captcha"], want) || c.TasksPending["2captcha"] != pending {
			t.Errorf("counts %v, %d pending; want %v, %d pending", c.Records, c.TasksPending["2captcha"], want, pending)
		}
	}

	const n = 20
	for i := range n {
		id := fmt.Sprint(i)
		if _, err := p.Insert(ctx, rec(id)); err != nil {
			t.Fatal(err)
		}
		setState(id, store.StateDelivered)
	}
	counts(map[store.State]int64{store.StateDelivered: n}, 0)
	if got, want := writes(), map[string]int64{"record_totals": n}; !maps.Equal(got, want) {
		t.Errorf("%d pingbacks inserted and delivered one at a time wrote count rows %v, want %v", n, got, want)
	}

	if _, err := p.AddTask(ctx, &store.Task{Provider: "2captcha", ID: "tracked", SubmittedAt: now.Add(-time.Minute),
		PingbackURL: "https://example.com/pb", State: store.TaskPending, NextPollAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	counts(map[store.State]int64{store.StateDelivered: n}, 1)
	if _, err := p.Insert(ctx, rec("tracked")); err != nil {
		t.Fatal(err)
	}
	setState("tracked", store.StateDelivered)
	counts(map[store.State]int64{store.StateDelivered: n + 1}, 0)
	// The task's insert (+1 pending), then the result's total and the task
	// leaving pending.
	if got, want := writes(), map[string]int64{"record_totals": n + 1, "task_counts": 2}; !maps.Equal(got, want) {
		t.Errorf("a tracked pingback: count rows written %v in all, want %v", got, want)
	}

	if _, err := p.Insert(ctx, rec("fails")); err != nil {
		t.Fatal(err)
	}
	counts(map[store.State]int64{store.StateDelivered: n + 1, store.StateForwarding: 1}, 0)
	setState("fails", store.StateFailed)
	counts(map[store.State]int64{store.StateDelivered: n + 1, store.StateFailed: 1}, 0)
	setState("fails", store.StateForwarding)
	counts(map[store.State]int64{store.StateDelivered: n + 1, store.StateForwarding: 1}, 0)
	setState("fails", store.StateDelivered)
	counts(map[store.State]int64{store.StateDelivered: n + 2}, 0)
	if got, want := writes(), map[string]int64{"record_totals": n + 2, "task_counts": 2, "record_counts": 2}; !maps.Equal(got, want) {
		t.Errorf("a failure and its replay: count rows written %v in all, want %v", got, want)
	}
}

// TestPostgresSchema10Counts: a database at schema version 10 with records
// in every state, of two providers, and a live pingback's time migrates
// to 11 with the same counts and last callback times; the counts then
// follow new records.
func TestPostgresSchema10Counts(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	ctx := context.Background()
	if err := pgstore.MigrateTo(ctx, dsn, schema, 10); err != nil {
		t.Fatal(err)
	}
	conn := pgConn(t, dsn, schema)
	t0 := time.Now().UTC().Truncate(time.Second)
	exp := t0.Add(time.Hour).UnixNano()
	want := map[string]map[store.State]int64{"2captcha": {}, "capsolver": {}}
	for i, st := range store.States {
		for j := range i + 1 {
			prov := "2captcha"
			if j%2 == 1 {
				prov = "capsolver"
			}
			src, at := "callback", t0.Add(time.Duration(i*10+j)*time.Second)
			if prov == "capsolver" {
				src = "poll"
			}
			if _, err := conn.Exec(ctx, `INSERT INTO records (provider, id, code, source, received_at, request, state, expires_at)
				VALUES ($1, $2, 'C', $3, $4, '{}', $5, $6)`, prov, fmt.Sprintf("%s-%d", st, j), src, at.UnixNano(), string(st), exp); err != nil {
				t.Fatal(err)
			}
			want[prov][st]++
		}
	}
	var last int64
	if err := conn.QueryRow(ctx, `SELECT max(received_at) FROM records WHERE source = 'callback'`).Scan(&last); err != nil {
		t.Fatal(err)
	}
	p := openPG(t, dsn, schema)
	check := func(when string) {
		t.Helper()
		c, err := p.Counts(ctx)
		if err != nil || !maps.EqualFunc(c.Records, want, maps.Equal) {
			t.Errorf("%s: counts %v, %v; want %v", when, c.Records, err, want)
		}
		a, err := p.Ages(ctx)
		if err != nil || !a.LastCallback["2captcha"].Equal(time.Unix(0, last)) || !a.LastCallback["capsolver"].IsZero() {
			t.Errorf("%s: last callbacks %v, %v; want 2captcha at %v only", when, a.LastCallback, err, time.Unix(0, last).UTC())
		}
	}
	check("migrated")
	if _, err := p.Insert(ctx, &store.Record{
		Provider: "capsolver", ID: "new", Code: "C", Source: store.SourcePoll, ReceivedAt: t0,
		Request:   store.Request{Method: "GET", URI: "/pb", Host: "example.com"},
		Delivery:  store.Delivery{State: store.StateQuarantined, UpdatedAt: t0},
		ExpiresAt: t0.Add(time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	want["capsolver"][store.StateQuarantined]++
	check("a record inserted")
}
