package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// SetClock makes p measure due times and leases by clock instead
// of the database's now(), for the conformance suite's injected times.
func SetClock(p *Postgres, clock func() time.Time) { p.clock = clock }

// FairClaimQuery is the query of a chunk of the claim's fair pass
// (after: a later chunk), its parameters as pgClaimPass.query says.
func FairClaimQuery(after bool) string { return pgFairPass.query(after) }

// MigrateTo brings schema in the database at dsn to version upTo
// (created if missing), as a build of that version would have left it.
func MigrateTo(ctx context.Context, dsn, schema string, upTo int) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := &pgDB{pool: pool, path: pgx.Identifier{schema}.Sanitize(), location: "test", log: zap.NewNop()}
	return migrate(ctx, db, schema, nil, upTo)
}

// DueTasksQuery is DueTasks' query; its parameters are the
// accounts' providers and ids (two text arrays), now (Unix ns) and the
// limit.
const DueTasksQuery = pgDueTasks

// TaskPageQuery is ListTaskPage's query for q and its arguments.
func TaskPageQuery(q store.TaskQuery) (string, []any) { return pgTaskPageQuery(q) }

// PreparedStatement is one row of pg_prepared_statements: the statement's
// text and how many times it was executed as a prepared statement
// (generic_plans + custom_plans: each execution picks one of the two).
type PreparedStatement struct {
	Statement string
	Runs      int64
}

// PreparedStatements returns the statements prepared on one of p's
// connections (pg_prepared_statements), by name. Open p with
// pool_max_conns=1 to see every statement it ran. The execution counts
// need PostgreSQL 14 or later; on an older server the error wraps
// errors.ErrUnsupported.
func PreparedStatements(ctx context.Context, p *Postgres) (map[string]PreparedStatement, error) {
	var version int
	if err := p.pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return nil, err
	}
	if version < 140000 {
		return nil, fmt.Errorf("pg_prepared_statements counts executions from PostgreSQL 14 on, the server is %d: %w", version, errors.ErrUnsupported)
	}
	rows, err := p.pool.Query(ctx, `SELECT name, statement, generic_plans + custom_plans FROM pg_prepared_statements`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]PreparedStatement{}
	for rows.Next() {
		var name string
		var ps PreparedStatement
		if err := rows.Scan(&name, &ps.Statement, &ps.Runs); err != nil {
			return nil, err
		}
		out[name] = ps
	}
	return out, rows.Err()
}
