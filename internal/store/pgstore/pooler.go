package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// The connection discipline that lets the store run unchanged behind a
// transaction pooler (PgBouncer's pool_mode = transaction, RDS Proxy,
// Supavisor, pgcat), which hands the server connection to another client
// at the end of every transaction:
//
//   - No startup parameter a pooler refuses by default (PgBouncer refuses
//     all but a few): the store's schema is not a search_path startup
//     parameter. Every transaction sets it with set_config(...,
//     true), the SET LOCAL of a SELECT, in its first round trip, and every
//     lone read is a one-statement transaction of one round trip (BEGIN,
//     the search_path, the query, COMMIT), so that no statement ever
//     depends on what an earlier transaction left on a connection.
//   - No named prepared statement kept across transactions: unless the
//     DSN sets pgx's default_query_exec_mode, the store uses "exec"
//     (unnamed statements, parsed in the same round trip they run in).
//     A DSN that asks for pgx's statement cache (cache_statement, or
//     cache_describe and describe_exec, which describe a statement in a
//     round trip of its own, outside the transaction) tells the store it
//     holds a connection of its own (a direct or session-pooled one): the
//     schema is then also set for the session, when the connection is
//     made. If such a DSN in fact goes through a transaction pooler, the
//     errors that follow (42P05, 26000) log one line naming the setting.
//   - No session-level lock: the migration's advisory lock and every other
//     lock are transaction-scoped.
//   - No setting read once per connection that a pooled connection could
//     change: every write transaction reads synchronous_commit in its
//     first round trip and fails with a *NotDurableError, rolled back,
//     when it is off.
//   - PgBouncer's pool_mode = statement cannot run a transaction of more
//     than one statement: it is refused at open, naming pool_mode.
//
// docs/storage.md ("Behind a pooler") says the same for users.

// pgPoolerDoc is where the errors and log lines of the pooler rules point.
const pgPoolerDoc = "docs/storage.md, \"Behind a pooler\""

// pgBeginWrite is the first statement of every write transaction, after
// BEGIN in the same round trip: the schema ($1) as the transaction's
// search_path, the transaction's id (for pgCommit) and the session's
// synchronous_commit (pgDB.opened scans and checks them).
const pgBeginWrite = `SELECT set_config('search_path', $1, true), txid_current(), current_setting('synchronous_commit')`

// pgBeginRead is the first statement of a lone read after BEGIN READ
// ONLY: the schema ($1) as the transaction's search_path.
const pgBeginRead = `SELECT set_config('search_path', $1, true)`

// pgDB is the store's connection pool under the pooler rules: lone reads
// (Query, QueryRow) run as one-statement read-only transactions with the
// store's search_path; writes acquire a connection and open their
// transaction with queueBegin or begin. It has no Exec and no SendBatch,
// so that no statement escapes those rules.
type pgDB struct {
	pool     *pgxpool.Pool
	path     string // the schema as a search_path value (a quoted identifier)
	location string // host:port/database, for errors and logs
	log      *zap.Logger

	// warned is set once the prepared-statement error has been logged.
	warned sync.Once
}

// Acquire returns a connection of the pool; the caller opens its
// transaction with queueBegin or begin.
func (d *pgDB) Acquire(ctx context.Context) (*pgxpool.Conn, error) { return d.pool.Acquire(ctx) }

// Ping checks that the database answers (an empty statement: no
// transaction, nothing a pooler keeps).
func (d *pgDB) Ping(ctx context.Context) error { return d.pool.Ping(ctx) }

// Reset closes every idle connection, so that the next ones are dialled
// anew (after a terminated backend).
func (d *pgDB) Reset() { d.pool.Reset() }

// Close closes the pool.
func (d *pgDB) Close() { d.pool.Close() }

// queueBegin queues the opening of a write transaction on b: BEGIN and
// pgBeginWrite. Its results are read with readBegin.
func (d *pgDB) queueBegin(b *pgx.Batch) {
	b.Queue("BEGIN")
	b.Queue(pgBeginWrite, d.path)
}

// readBegin reads the results queueBegin queued: the transaction's id
// into c (if c is not nil) and its synchronous_commit, refused when off
// (a *NotDurableError; the caller drops the transaction).
func (d *pgDB) readBegin(br pgx.BatchResults, c *pgCommit) error {
	if _, err := br.Exec(); err != nil {
		return err
	}
	return d.opened(br.QueryRow(), c)
}

// begin opens a write transaction on conn in two round trips (BEGIN, then
// pgBeginWrite), for code that runs its statements through a pgx.Tx.
func (d *pgDB) begin(ctx context.Context, conn *pgxpool.Conn, c *pgCommit) (pgx.Tx, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return tx, d.opened(tx.QueryRow(ctx, pgBeginWrite, d.path), c)
}

// opened scans pgBeginWrite's row: the transaction's id into c (if c is
// not nil), and its synchronous_commit, refused when off.
func (d *pgDB) opened(row pgx.Row, c *pgCommit) error {
	var path, sc string
	var xid int64
	if err := row.Scan(&path, &xid, &sc); err != nil {
		return err
	}
	if c != nil {
		c.xid = xid
	}
	return d.checkDurable(sc)
}

// checkDurable refuses a transaction whose synchronous_commit is off.
func (d *pgDB) checkDurable(setting string) error {
	if setting == "off" {
		return &NotDurableError{Location: d.location, Setting: setting}
	}
	return nil
}

// Query runs a lone read as a one-statement read-only transaction of one
// round trip (BEGIN READ ONLY, the search_path, sql, COMMIT). The rows
// hold the connection until they are closed or read to the end.
func (d *pgDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN READ ONLY")
	b.Queue(pgBeginRead, d.path)
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	br := conn.SendBatch(ctx, b)
	fail := func(err error) (pgx.Rows, error) {
		_ = br.Close()
		conn.Release() // a connection left in a transaction is destroyed, not pooled
		return nil, err
	}
	if _, err := br.Exec(); err != nil {
		return fail(err)
	}
	if _, err := br.Exec(); err != nil {
		return fail(err)
	}
	rows, err := br.Query()
	if err != nil {
		return fail(err)
	}
	return &pgLoneRows{Rows: rows, br: br, conn: conn}, nil
}

// QueryRow is Query for at most one row: its Scan returns pgx.ErrNoRows
// when there is none.
func (d *pgDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return &pgLoneRow{db: d, ctx: ctx, sql: sql, args: args}
}

// pgLoneRows are the rows of a lone read: closing them, or reading past
// the last, commits the read's transaction and releases its connection.
type pgLoneRows struct {
	pgx.Rows
	br   pgx.BatchResults
	conn *pgxpool.Conn
	done bool
	err  error // of the COMMIT or the batch's close
}

func (r *pgLoneRows) Next() bool {
	if r.done {
		return false
	}
	if r.Rows.Next() {
		return true
	}
	r.finish()
	return false
}

func (r *pgLoneRows) Close() { r.finish() }

func (r *pgLoneRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

// finish closes the rows, reads the COMMIT's result and releases the
// connection, once.
func (r *pgLoneRows) finish() {
	if r.done {
		return
	}
	r.done = true
	r.Rows.Close()
	if r.Rows.Err() == nil {
		if _, err := r.br.Exec(); err != nil {
			r.err = err
		}
	}
	if err := r.br.Close(); err != nil && r.err == nil && r.Rows.Err() == nil {
		r.err = err
	}
	r.conn.Release()
}

// pgLoneRow is QueryRow's row: the read runs when it is scanned.
type pgLoneRow struct {
	db   *pgDB
	ctx  context.Context
	sql  string
	args []any
}

func (r *pgLoneRow) Scan(dest ...any) error {
	rows, err := r.db.Query(r.ctx, r.sql, r.args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// pgSessionPathModes are the exec modes that describe (and, for
// cache_statement, prepare) a statement in a round trip of its own,
// before the transaction that runs it: they need the schema on the
// session, which only a connection of the store's own keeps.
var pgSessionPathModes = map[pgx.QueryExecMode]bool{
	pgx.QueryExecModeCacheStatement: true,
	pgx.QueryExecModeCacheDescribe:  true,
	pgx.QueryExecModeDescribeExec:   true,
}

// preparedStatementError reports whether err is one a transaction pooler
// causes for a client that keeps named prepared statements: 42P05
// (duplicate_prepared_statement: the server connection has another
// client's) or 26000 (invalid_sql_statement_name: the statement was
// prepared on another server connection).
func preparedStatementError(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000")
}

// notePreparedStatementError logs, once per store, what a prepared
// statement error behind a pooler means and which DSN setting causes it.
func (d *pgDB) notePreparedStatementError(err error) {
	if !preparedStatementError(err) {
		return
	}
	d.warned.Do(func() {
		d.log.Error("postgres prepared statement error: the DSN's default_query_exec_mode keeps prepared statements on a connection, "+
			"but a transaction pooler (PgBouncer pool_mode = transaction, RDS Proxy, Supavisor) gives each transaction another server connection; "+
			"remove default_query_exec_mode from the DSN (the store then uses exec) or pool in session mode; see "+pgPoolerDoc,
			zap.String("store", d.location), zap.String("error", redactedError(err)))
	})
}

// statementPoolingError reports whether err is PgBouncer's refusal of a
// transaction in pool_mode = statement.
func statementPoolingError(err error) bool {
	return err != nil && strings.Contains(err.Error(), "statement pooling mode")
}

// errStatementPooling is the open's error behind a statement pooler.
func errStatementPooling(location string, err error) error {
	return fmt.Errorf("postgres %s: the connection pooler runs in statement pooling mode (%s), which cannot run the store's transactions: "+
		"set pool_mode = transaction or session for this database (see %s)", location, redactedError(err), pgPoolerDoc)
}

// errPreparedStatement is the open's error on a prepared statement error
// (preparedStatementError).
func errPreparedStatement(location string, err error) error {
	return fmt.Errorf("postgres %s: %s: the DSN's default_query_exec_mode keeps prepared statements on a connection, which a transaction pooler hands to other clients: "+
		"remove it from the DSN, or pool in session mode (see %s)", location, redactedError(err), pgPoolerDoc)
}
