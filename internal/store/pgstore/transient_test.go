package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5/pgconn"
)

// safeErr is an error that says it happened before anything was sent,
// the way pgconn's own errors do.
type safeErr struct{ safe bool }

func (e safeErr) Error() string     { return "before sending" }
func (e safeErr) SafeToRetry() bool { return e.safe }

func TestTransientError(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Severity: "FATAL", Code: code, Message: "m"} }
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"08000 connection_exception", pg("08000"), true},
		{"08003 connection_does_not_exist", pg("08003"), true},
		{"08006 connection_failure", pg("08006"), true},
		{"08P01 protocol_violation", pg("08P01"), true},
		{"57P01 admin_shutdown (pg_terminate_backend)", pg("57P01"), true},
		{"57P01 wrapped", fmt.Errorf("insert: %w", pg("57P01")), true},
		{"57P02 crash_shutdown", pg("57P02"), true},
		{"57P03 cannot_connect_now", pg("57P03"), true},
		{"57P05 idle_session_timeout", pg("57P05"), true},
		{"57P04 database_dropped", pg("57P04"), false},
		{"25006 read_only_sql_transaction (a standby after a failover)", pg("25006"), true},
		{"25001 active_sql_transaction", pg("25001"), false},
		{"57014 query_canceled", pg("57014"), false},
		{"40001 serialization_failure", pg("40001"), false},
		{"40P01 deadlock_detected", pg("40P01"), false},
		{"23505 unique_violation", pg("23505"), false},
		{"23503 foreign_key_violation", pg("23503"), false},
		{"53100 disk_full", pg("53100"), false},
		{"53300 too_many_connections", pg("53300"), false},
		{"42P01 undefined_table", pg("42P01"), false},
		{"empty code", pg(""), false},
		{"safe to retry", safeErr{true}, true},
		{"safe to retry, wrapped", fmt.Errorf("acquire: %w", safeErr{true}), true},
		{"not safe to retry", safeErr{false}, false},
		{"EOF", io.EOF, true},
		{"unexpected EOF, wrapped", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"bare ECONNRESET", syscall.ECONNRESET, true},
		{"broken pipe", fmt.Errorf("write: %w", os.NewSyscallError("write", syscall.EPIPE)), true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		{"net.ErrClosed", fmt.Errorf("read: %w", net.ErrClosed), true},
		{"pgconn conn closed", fmt.Errorf("query: %w", pgconn.ErrConnClosed), true},
		{"context canceled", context.Canceled, false},
		{"deadline exceeded, wrapped", fmt.Errorf("insert: %w", context.DeadlineExceeded), false},
		{"canceled with a connection error", errors.Join(context.Canceled, io.EOF), false},
		{"deadline with a 57P01", errors.Join(pg("57P01"), context.DeadlineExceeded), false},
		{"anything else", errors.New("decoding history: bad json"), false},
		{"ErrClosed (the store's)", store.ErrClosed, false},
		{"ErrTooLarge", store.ErrTooLarge, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := transientError(tt.err); got != tt.want {
				t.Errorf("transientError(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
