package pgstore

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Transient database faults on PostgreSQL. An insert, an outcome (a
// delivery update), a claim or a task read that fails on a
// connection-level error is run once more on a newly dialled connection:
// a terminated backend (pg_terminate_backend, a server restart that is
// over) leaves every pooled connection dead, so the pool is reset first.
// Only errors that say the connection, not the statement, failed are
// retried (transientError), and 25006 (a read-only transaction: the
// server reached is a standby, as after a failover, and a new connection
// may reach the new primary); a statement the server refused
// (serialization failure, deadlock, constraint, out of resources) is
// not, nor is a cancelled or expired context.
//
// A connection can drop after COMMIT was sent: the commit may have
// landed. Each transaction therefore learns its transaction id before
// COMMIT, and after such a drop the store asks the database (on a new
// connection) whether that transaction committed: if it did, the
// attempt's results stand (an insert is "new, committed", not a
// duplicate of itself); if it aborted, the attempt is run again; if the
// database cannot say, the error stands.

// Transient SQLSTATEs outside class 08 (connection exception).
var pgTransientCodes = map[string]bool{
	"57P01": true, // admin_shutdown: pg_terminate_backend, smart or fast shutdown
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now: the server is starting or in recovery
	"57P05": true, // idle_session_timeout
	"25006": true, // read_only_sql_transaction: a standby, after a failover, still behind the DSN's address
}

// transientError reports whether err is a connection-level fault that a
// new connection may not have: SQLSTATE class 08, 57P01, 57P02, 57P03,
// 57P05 and 25006; errors pgconn reports as safe to retry (nothing was sent); EOF;
// network errors (resets, broken pipes, refused dials); a closed
// connection. Any other server error (40001, 40P01, 23xxx, 53xxx, ...) is
// not transient, and neither is a cancelled or expired context.
func transientError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) {
		return pgErr.Code[:min(2, len(pgErr.Code))] == "08" || pgTransientCodes[pgErr.Code]
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	var netErr net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &netErr) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, net.ErrClosed)
}

// pgCommit is what one transaction attempt tells its retry: its
// transaction id (0 before it is known) and whether COMMIT was sent.
type pgCommit struct {
	xid  int64
	sent bool
}

// afterFailure decides what follows an attempt that failed with err:
// committed (its COMMIT landed although the connection dropped: the
// attempt's results stand) or retry (nothing of it committed and err is
// transient: run it once more). Neither means err stands. The pool is
// reset before a retry, so that it dials new connections.
func (p *Postgres) afterFailure(ctx context.Context, what string, err error, c *pgCommit) (committed, retry bool) {
	if err == nil || !transientError(err) || ctx.Err() != nil || p.closed.Load() {
		return false, false
	}
	p.pool.Reset()
	if c.sent {
		if c.xid == 0 {
			return false, false // cannot tell whether it committed
		}
		ok, serr := p.xactCommitted(ctx, c.xid)
		if serr != nil {
			p.log.Warn("postgres connection lost after COMMIT was sent, and the commit's outcome is unknown",
				zap.String("store", p.location), zap.String("operation", what),
				zap.String("error", redactedError(err)), zap.String("status_error", redactedError(serr)))
			return false, false
		}
		if ok {
			p.log.Info("postgres connection lost after COMMIT was sent; the commit landed",
				zap.String("store", p.location), zap.String("operation", what), zap.String("error", redactedError(err)))
			return true, false
		}
	}
	p.log.Info("postgres connection lost; retrying once on a new connection",
		zap.String("store", p.location), zap.String("operation", what), zap.String("error", redactedError(err)))
	return false, true
}

// pgStatusWait bounds how long xactCommitted waits for a transaction
// the server still has in progress.
const pgStatusWait = 5 * time.Second

// xactCommitted reports whether transaction xid committed, asking on a
// new connection; while the server still has it in progress (it has not
// yet noticed the client is gone) it asks again every 10 ms, until ctx
// ends or for pgStatusWait at most.
func (p *Postgres) xactCommitted(ctx context.Context, xid int64) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, pgStatusWait)
	defer cancel()
	for {
		var status *string
		if err := p.pool.QueryRow(ctx, `SELECT txid_status($1)`, xid).Scan(&status); err != nil {
			return false, err
		}
		switch {
		case status == nil:
			return false, errors.New("transaction status no longer known")
		case *status == "committed":
			return true, nil
		case *status == "aborted":
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// retryTransient runs attempt, and once more on a new connection if it
// failed on a transient error with nothing of it committed (see
// afterFailure). attempt must reset whatever results it sets.
func (p *Postgres) retryTransient(ctx context.Context, what string, attempt func(ctx context.Context, c *pgCommit) error) error {
	c := &pgCommit{}
	err := attempt(ctx, c)
	committed, retry := p.afterFailure(ctx, what, err, c)
	switch {
	case committed:
		return nil
	case retry:
		return attempt(ctx, &pgCommit{})
	}
	return err
}

// txRetry is tx (one READ COMMITTED transaction around fn) retried once
// on a transient error by retryTransient: fn may run twice and must
// reset its results.
func (p *Postgres) txRetry(ctx context.Context, what string, fn func(tx pgx.Tx) error) error {
	return p.op(func() error {
		return p.retryTransient(ctx, what, func(ctx context.Context, c *pgCommit) error {
			return p.runTx(ctx, c, fn)
		})
	})
}
