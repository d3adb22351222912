package pgstore_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// pgConn connects to the test database with search_path set to schema.
func pgConn(t *testing.T, dsn, schema string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "SET search_path TO "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return conn
}

// explain returns the plan of sql with args, as text.
func explain(t *testing.T, conn *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	rows, err := conn.Query(context.Background(), "EXPLAIN "+sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(plan, "\n")
}

// TestPostgresAccountPlans: with 20,000 due tasks of accounts this
// instance does not have (another instance's on a shared database, keys
// it lacks) and a few of its own, DueTasks reads tasks_due_account
// (0009_accounts.sql) once per account asked for; and a page of one
// account's tasks, with a state or not, is read from an index by account
// (tasks_account_submitted, tasks_account_state_submitted), never
// stepping over the tasks of the other accounts.
func TestPostgresAccountPlans(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	p := openPG(t, dsn, schema)
	conn := pgConn(t, dsn, schema)
	ctx := context.Background()
	for _, q := range []string{
		// Submitted at even times, others' tasks: 40,000, 20,000 of
		// them due, the rest done or expired; at odd times, mine: 2,000
		// (10 pending, the rest done or expired).
		`INSERT INTO tasks (provider, id, account, pingback_url, state, submitted_at, next_poll_at, expires_at)
			SELECT 'p', 'o' || g, 'other' || (g % 4), '', CASE WHEN g % 2 = 0 THEN 'pending' WHEN g % 4 = 1 THEN 'done' ELSE 'expired' END,
				2 * g, CASE WHEN g % 2 = 0 THEN g END, 9000000000000000000 FROM generate_series(1, 40000) g`,
		`INSERT INTO tasks (provider, id, account, pingback_url, state, submitted_at, next_poll_at, expires_at)
			SELECT 'p', 'm' || g, 'mine', '', CASE WHEN g % 200 = 0 THEN 'pending' WHEN g % 2 = 0 THEN 'done' ELSE 'expired' END,
				40 * g + 1, CASE WHEN g % 200 = 0 THEN g END, 9000000000000000000 FROM generate_series(1, 2000) g`,
		"ANALYZE tasks",
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Every task is due; only "mine" is asked for.
	plan := explain(t, conn, pgstore.DueTasksQuery, []string{"p"}, []string{"mine"}, int64(1<<62), 1000)
	if !strings.Contains(plan, "tasks_due_account") || strings.Contains(plan, "Seq Scan on tasks") {
		t.Errorf("plan of DueTasks does not read tasks_due_account alone:\n%s", plan)
	}
	due, err := p.DueTasks(ctx, store.DueQuery{Now: time.Unix(0, 1<<62), Limit: 1000, Accounts: []store.Account{{Provider: "p", ID: "mine"}}})
	if err != nil || len(due) != 10 {
		t.Errorf("DueTasks of mine = %d tasks, %v; want its 10 pending", len(due), err)
	}
	for _, q := range []store.TaskQuery{
		{Account: "mine", Limit: 100},
		{Account: "mine", State: store.TaskPending, Limit: 100},
		{Account: "mine", Provider: "p", State: store.TaskExpired, Limit: 100,
			After: &store.TaskPosition{SubmittedAt: time.Unix(0, 40*3+1), Key: store.Key{Provider: "p", ID: "m3"}}},
	} {
		sql, args := pgstore.TaskPageQuery(q)
		plan := explain(t, conn, sql, args...)
		byAccount := false
		for line := range strings.Lines(plan) {
			if strings.Contains(line, "Index Cond: (") && strings.Contains(line, "account = 'mine'::text") {
				byAccount = true
			}
		}
		if !strings.Contains(plan, "tasks_account_") || !byAccount || strings.Contains(plan, "Seq Scan") {
			t.Errorf("plan of ListTaskPage(%+v) does not read the account's index:\n%s", q, plan)
		}
	}
}

// TestPostgresSchema8Accounts: a database at schema version 8 with tasks
// migrates to 9 with each provider's tasks stamped with its account from
// LegacyAccounts (a provider missing from the map keeps its tasks without
// one), the task counts moved to the accounts, and the provider's poll
// budget moved to the account; a later open's map changes nothing.
func TestPostgresSchema8Accounts(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	ctx := context.Background()
	if err := pgstore.MigrateTo(ctx, dsn, schema, 8); err != nil {
		t.Fatal(err)
	}
	conn := pgConn(t, dsn, schema)
	now := time.Now().UTC().Truncate(time.Second)
	// The rows as a build of schema 8 wrote them: no account column.
	if _, err := conn.Exec(ctx, `INSERT INTO tasks (provider, id, pingback_url, state, submitted_at, next_poll_at, expires_at) VALUES
			('2captcha', 'p1', 'https://example.com/cb', 'pending', $1, $1, $2),
			('2captcha', 'p2', 'https://example.com/cb', 'pending', $1, $1 + 1, $2),
			('2captcha', 'd1', 'https://example.com/cb', 'done', $1, NULL, $2),
			('capsolver', 'q1', 'https://example.com/cb', 'pending', $1, $1, $2)`,
		now.UnixNano(), now.Add(24*time.Hour).UnixNano()); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO providers (provider, polls, tracked) VALUES ('2captcha', 7, 3), ('capsolver', 2, 1)`); err != nil {
		t.Fatal(err)
	}
	const acct = "0123456789abcdef"
	open := func(legacy map[string]string) *pgstore.Postgres {
		t.Helper()
		p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: schema, LegacyAccounts: legacy})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	check := func(p *pgstore.Postgres, when string) {
		t.Helper()
		for id, want := range map[store.Key]string{{Provider: "2captcha", ID: "p1"}: acct, {Provider: "2captcha", ID: "d1"}: acct, {Provider: "capsolver", ID: "q1"}: ""} {
			if tk, err := p.GetTask(ctx, id); err != nil || tk.Account != want {
				t.Errorf("%s: task %s = %+v, %v; want account %q", when, id, tk, err, want)
			}
		}
		c, err := p.Counts(ctx)
		want := map[string]map[string]int64{"2captcha": {acct: 2}, "capsolver": {"": 1}}
		if err != nil || !maps.EqualFunc(c.TasksPendingByAccount, want, maps.Equal) || c.TasksPending["2captcha"] != 2 {
			t.Errorf("%s: counts %+v, %v; want pending by account %v", when, c, err, want)
		}
		due, err := p.DueTasks(ctx, store.DueQuery{Now: now.Add(time.Second), Limit: 10, Accounts: []store.Account{{Provider: "2captcha", ID: acct}}})
		if err != nil || len(due) != 2 || due[0].ID != "p1" || due[1].ID != "p2" {
			t.Errorf("%s: DueTasks of 2captcha/%s = %+v, %v; want p1, p2", when, acct, due, err)
		}
		budgets, err := p.PollBudgets(ctx)
		wantB := map[store.Account]store.PollBudget{{Provider: "2captcha", ID: acct}: {Polls: 7, Tracked: 3}, {Provider: "capsolver"}: {Polls: 2, Tracked: 1}}
		if err != nil || !maps.Equal(budgets, wantB) {
			t.Errorf("%s: PollBudgets = %v, %v; want %v", when, budgets, err, wantB)
		}
	}
	p := open(map[string]string{"2captcha": acct})
	check(p, "migrated")
	var version int
	if err := conn.QueryRow(ctx, "SELECT max(version) FROM schema_version").Scan(&version); err != nil || version != pgstore.SchemaVersion() {
		t.Errorf("schema version %d, %v; want %d", version, err, pgstore.SchemaVersion())
	}
	p.Close()
	check(open(map[string]string{"2captcha": "ffffffffffffffff", "capsolver": "ffffffffffffffff"}), "opened again")
}
