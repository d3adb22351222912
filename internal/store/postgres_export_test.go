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
