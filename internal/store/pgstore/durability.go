package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// NotDurableError is a PostgreSQL session whose COMMIT may return before
// the WAL is flushed: synchronous_commit off. Every connection of the
// store's pool is checked when it is made (pgxpool's AfterConnect), not
// only the first: an ALTER ROLE/DATABASE ... SET synchronous_commit = off
// applies to the connections made after it. Such a connection is
// refused: at open, Open fails with this error; later, every
// operation that needs a new connection fails with it, the store's
// monitor marks it unavailable (pingback_health answers 503, pingbacks take
// the commit-failure path: forwarded, 200 only if the app took them) and
// an error line is logged at most once a minute until the setting is back.
// Connections made before the change keep their setting and stay in use.
type NotDurableError struct {
	Location string // host:port/database
	Setting  string // the session's synchronous_commit
}

func (e *NotDurableError) Error() string {
	return fmt.Sprintf("postgres %s: synchronous_commit is %s for this session: a COMMIT could return before the result is on disk, and a pingback would be answered 200 for a result a crash can lose; set it to on (the default), remote_write, remote_apply or local (check ALTER ROLE/DATABASE/SYSTEM settings)",
		e.Location, e.Setting)
}

// pgDurability checks every new connection of a pool (afterConnect).
type pgDurability struct {
	location string
	log      *zap.Logger

	mu        sync.Mutex
	refusedAt time.Time // last "refused" log line
	fsyncAt   time.Time // last "fsync off" log line
}

// durabilityLogEvery is how often the refusal and the fsync warning are
// logged at most while they last.
const durabilityLogEvery = time.Minute

// afterConnect reads the new session's synchronous_commit and the
// server's fsync. synchronous_commit off refuses the connection (a
// *NotDurableError). fsync off is logged at error level (at most once a
// minute) but not refused: the store's contract is what issue "several
// instances" pins (refuse only synchronous_commit off), and fsync is a
// server-wide choice (a throw-away or battery-backed test cluster, say)
// that the plugin cannot make safe by refusing; the log line says plainly
// that acknowledged pingbacks can then be lost to a power failure or OS
// crash.
func (d *pgDurability) afterConnect(ctx context.Context, conn *pgx.Conn) error {
	var sc, fsync string
	if err := conn.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('fsync')").Scan(&sc, &fsync); err != nil {
		return fmt.Errorf("reading synchronous_commit and fsync: %w", err)
	}
	now := time.Now()
	if sc == "off" {
		err := &NotDurableError{Location: d.location, Setting: sc}
		if d.due(&d.refusedAt, now) {
			d.log.Error("postgres connection refused: synchronous_commit is off for new sessions; the store is unavailable until it is on again",
				zap.String("store", d.location), zap.Error(err))
		}
		return err
	}
	if fsync == "off" && d.due(&d.fsyncAt, now) {
		d.log.Error("postgres server runs with fsync off: a COMMIT is not flushed to disk, so pingbacks answered 200 can be lost to a power failure or an OS crash; turn fsync on for production",
			zap.String("store", d.location))
	}
	return nil
}

// due reports whether a line last logged at *at may be logged again now,
// and if so marks it logged.
func (d *pgDurability) due(at *time.Time, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !at.IsZero() && now.Sub(*at) < durabilityLogEvery {
		return false
	}
	*at = now
	return true
}

// isNotDurable reports whether err is (or wraps) a *NotDurableError.
func isNotDurable(err error) bool {
	var nd *NotDurableError
	return errors.As(err, &nd)
}
