package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SetPostgresClock makes p measure due times and leases by clock instead
// of the database's now(), for the conformance suite's injected times.
func SetPostgresClock(p *Postgres, clock func() time.Time) { p.clock = clock }

// PostgresFairClaimQuery is the query of a chunk of the claim's fair pass
// (after: a later chunk), its parameters as pgClaimPass.query says.
func PostgresFairClaimQuery(after bool) string { return pgFairPass.query(after) }

// MigratePostgresTo brings schema in the database at dsn to version upTo
// (created if missing), as a build of that version would have left it.
func MigratePostgresTo(ctx context.Context, dsn, schema string, upTo int) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrate(ctx, pool, schema, nil, upTo)
}

// PostgresDueTasksQuery is DueTasks' query; its parameters are the
// accounts' providers and ids (two text arrays), now (Unix ns) and the
// limit.
const PostgresDueTasksQuery = pgDueTasks

// PostgresTaskPageQuery is ListTaskPage's query for q and its arguments.
func PostgresTaskPageQuery(q TaskQuery) (string, []any) { return pgTaskPageQuery(q) }

// PostgresPreparedStatements returns the statements prepared on one of p's
// connections (pg_prepared_statements), each with the times it was
// planned or ran from a cached plan (generic_plans + custom_plans, version
// 14 on). Open p with pool_max_conns=1 to see every statement it ran.
func PostgresPreparedStatements(ctx context.Context, p *Postgres) (map[string]int64, error) {
	rows, err := p.pool.Query(ctx, `SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, err
		}
		out[s] += n
	}
	return out, rows.Err()
}
