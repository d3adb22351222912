package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// Defaults of Options.
const (
	// DefaultLeaseTerm is how long a lease on PostgreSQL lasts
	// unless renewed (every third of it while the forward runs): the time
	// within which another instance takes over the forwards of an
	// instance that died.
	DefaultLeaseTerm = 15 * time.Second
	// DefaultOpenWait is how long Open retries an unreachable
	// database before it fails.
	DefaultOpenWait = 10 * time.Second
	// DefaultSchema is the schema the store's tables live in.
	DefaultSchema = "pingback"
	// DefaultApplicationName is the application_name the
	// store's connections show in pg_stat_activity unless the DSN sets
	// one.
	DefaultApplicationName = "caddy-pingback"
	// DefaultMaxConns is the pool size unless the DSN sets
	// pool_max_conns: concurrent commits share the server's WAL flushes
	// (its group commit), so a few connections carry many pingbacks.
	DefaultMaxConns = 8
)

// Options configure Open.
type Options struct {
	// DSN is a libpq connection string or postgres:// URL (pgx syntax;
	// pool_max_conns and the other pgxpool settings are accepted; an
	// application_name names the connections in pg_stat_activity, default
	// DefaultApplicationName). Unless it sets
	// default_query_exec_mode, the store runs statements in pgx's "exec"
	// mode, which works behind transaction poolers (see pgDB). Required.
	DSN string
	// Schema holds the store's tables; created if missing (only then is
	// the database's CREATE right needed). Default "pingback".
	Schema string
	// LeaseTerm is how long a lease lasts unless renewed. Default
	// DefaultLeaseTerm.
	LeaseTerm time.Duration
	// OpenWait is how long Open retries while the database is
	// unreachable. Default DefaultOpenWait.
	OpenWait time.Duration
	// Logger receives the store's log lines. Nil discards them.
	Logger *zap.Logger
	// LegacyAccounts maps a provider's name to an account id (Task.
	// Account): given to every task stored before tasks had accounts,
	// once, by the schema 0009 migration, in its transaction (the open
	// that migrates the database from version 8 or earlier; later opens
	// ignore it), together with the provider's poll budget row. The app
	// passes the account of each provider's first configured key; a
	// provider missing from the map leaves its tasks without account.
	LegacyAccounts map[string]string
}

// Postgres is the Store on PostgreSQL, shared by any number of Caddy
// instances. Every write is one transaction that returns after COMMIT,
// which with synchronous_commit on (refused otherwise) returns after the
// WAL is flushed; concurrent commits share flushes (the server's group
// commit). Claims take rows with FOR UPDATE SKIP LOCKED, so instances
// never claim the same record, and leases are measured by the database's
// clock (now()), never the instances'.
type Postgres struct {
	pool      *pgDB
	log       *zap.Logger
	owner     string
	leaseTerm time.Duration
	location  string // host:port/database, for logs; never the password

	// clock, if set, replaces the database's now() (tests: the
	// conformance suite injects every time). Production stores leave it
	// nil.
	clock func() time.Time

	inserts *pgBatcher[*pgInsert]
	updates *pgBatcher[*pgUpdate]

	available atomic.Bool
	closed    atomic.Bool
	once      sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// Location returns host:port/database of a DSN, the name logs and
// errors give the database: never its password.
func Location(dsn string) (string, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("postgres dsn: %w", err)
	}
	return fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database), nil
}

// Open connects to the database (retrying for opts.OpenWait while
// it is unreachable), refuses a session with synchronous_commit off (a
// *NotDurableError; every later connection of the pool is checked too),
// migrates the schema under an advisory lock and returns the store.
func Open(opts Options) (*Postgres, error) {
	if opts.Schema == "" {
		opts.Schema = DefaultSchema
	}
	if opts.LeaseTerm <= 0 {
		opts.LeaseTerm = DefaultLeaseTerm
	}
	if opts.OpenWait <= 0 {
		opts.OpenWait = DefaultOpenWait
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	cfg, err := pgxpool.ParseConfig(opts.DSN)
	if err != nil {
		return nil, fmt.Errorf("postgres dsn: %w", err)
	}
	loc := fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	if !strings.Contains(opts.DSN, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	// No search_path startup parameter (poolers refuse it): every
	// transaction sets it (postgres_pooler rules, pgDB).
	path := pgx.Identifier{opts.Schema}.Sanitize()
	if !strings.Contains(opts.DSN, "default_query_exec_mode") {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	sessionPath := pgSessionPathModes[cfg.ConnConfig.DefaultQueryExecMode]
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = DefaultApplicationName
	}
	cfg.ConnConfig.ConnectTimeout = min(max(cfg.ConnConfig.ConnectTimeout, 0), 5*time.Second)
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	durability := &pgDurability{location: loc, log: opts.Logger}
	cfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if err := durability.afterConnect(ctx, conn); err != nil {
			return err
		}
		if !sessionPath {
			return nil
		}
		// A mode that describes statements outside their transaction
		// needs the schema on the session: the DSN says the connection
		// is the store's own.
		_, err := conn.Exec(ctx, "SET search_path TO "+path)
		return err
	}
	pgxPool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres %s: %w", loc, err)
	}
	pool := &pgDB{pool: pgxPool, path: path, location: loc, log: opts.Logger}
	ctx, cancel := context.WithTimeout(context.Background(), opts.OpenWait)
	defer cancel()
	var lastErr error
	for {
		err := pool.Ping(ctx)
		if err == nil {
			lastErr = nil
			break
		}
		if ctx.Err() != nil {
			if lastErr == nil {
				lastErr = err
			}
			break
		}
		lastErr = err // the last error before the deadline says why
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) || isNotDurable(err) {
			break // the server answered (a bad password, say): no use waiting
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
	if lastErr != nil {
		pool.Close()
		if nd := (*NotDurableError)(nil); errors.As(lastErr, &nd) {
			return nil, nd
		}
		if preparedStatementError(lastErr) {
			return nil, errPreparedStatement(loc, lastErr)
		}
		if pgErr := (*pgconn.PgError)(nil); errors.As(lastErr, &pgErr) {
			return nil, fmt.Errorf("postgres %s: %s", loc, redactedError(lastErr))
		}
		return nil, fmt.Errorf("postgres %s unreachable for %s: %s", loc, opts.OpenWait, redactedError(lastErr))
	}
	// Every connection, this first one included, was checked by
	// pgDurability.afterConnect: synchronous_commit off is refused.
	if err := migrate(ctx, pool, opts.Schema, opts.LegacyAccounts, 0); err != nil {
		pool.Close()
		if statementPoolingError(err) {
			return nil, errStatementPooling(loc, err)
		}
		if preparedStatementError(err) {
			return nil, errPreparedStatement(loc, err)
		}
		if nd := (*NotDurableError)(nil); errors.As(err, &nd) {
			return nil, nd
		}
		return nil, fmt.Errorf("postgres %s: %w", loc, err)
	}
	p := &Postgres{
		pool:      pool,
		log:       opts.Logger,
		owner:     newPostgresOwner(),
		leaseTerm: opts.LeaseTerm,
		location:  loc,
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	p.inserts = newPGBatcher(p.insertBatch, 0) // an insert is never deferrable: someone waits to answer
	p.updates = newPGBatcher(p.updateBatch, pgLazyWait)
	p.available.Store(true)
	go p.monitor()
	return p, nil
}

// redactedError is err's text; pgconn's connect errors name host, user
// and database but never the password.
func redactedError(err error) string { return err.Error() }

// newPostgresOwner names a store handle as a lease owner: host, process
// and a random part, unique among every handle on the database.
func newPostgresOwner() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Location is the store's database as host:port/database.
func (p *Postgres) Location() string { return p.location }

// monitor checks the database every second (once more on a new
// connection after a transient error) and keeps Available in step:
// one log line when it goes away, one a minute while it stays away, one
// when it is back.
func (p *Postgres) monitor() {
	defer close(p.done)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var downSince, lastLog time.Time
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := p.probe(ctx)
		if transientError(err) && ctx.Err() == nil {
			// A dead pooled connection (a terminated backend) is no
			// outage: ask again on a new one.
			p.pool.Reset()
			err = p.probe(ctx)
		}
		cancel()
		now := time.Now()
		switch {
		case err == nil && !downSince.IsZero():
			p.log.Info("postgres store reachable again", zap.String("store", p.location), zap.Duration("down_for", now.Sub(downSince)))
			downSince = time.Time{}
			p.available.Store(true)
		case err == nil:
			p.available.Store(true)
		case downSince.IsZero():
			downSince, lastLog = now, now
			p.available.Store(false)
			msg := "postgres store unreachable: pingbacks are forwarded without durability, replays and polling pause"
			if isNotDurable(err) {
				msg = "postgres store unavailable: new connections are refused (synchronous_commit off); pingbacks are forwarded without durability, replays and polling pause"
			}
			p.log.Error(msg, zap.String("store", p.location), zap.String("error", redactedError(err)))
		case now.Sub(lastLog) >= time.Minute:
			lastLog = now
			p.log.Error("postgres store still unreachable", zap.String("store", p.location),
				zap.Duration("down_for", now.Sub(downSince)), zap.String("error", redactedError(err)))
		}
	}
}

// probe is the monitor's check: the database answers a read, and its
// synchronous_commit is not off (a *NotDurableError). Behind a pooler the
// setting is that of whichever server connection the read got, as for
// every write transaction (pgDB.readBegin).
func (p *Postgres) probe(ctx context.Context) error {
	var sc string
	if err := p.pool.QueryRow(ctx, `SELECT current_setting('synchronous_commit')`).Scan(&sc); err != nil {
		return err
	}
	return p.pool.checkDurable(sc)
}

// Owner implements Store.
func (p *Postgres) Owner() string { return p.owner }

// LeaseTerm implements Store.
func (p *Postgres) LeaseTerm() time.Duration { return p.leaseTerm }

// Available implements Store: false while the database does not answer
// (checked every second) and after Close.
func (p *Postgres) Available() bool { return !p.closed.Load() && p.available.Load() }

// Close implements Store.
func (p *Postgres) Close() error {
	p.once.Do(func() {
		p.closed.Store(true)
		p.inserts.close() // the committed-to-be finish; later ones get ErrClosed
		p.updates.close()
		close(p.stop)
		<-p.done
		p.pool.Close()
	})
	return nil
}

// clockArg is the $clock parameter of the queries that read the time:
// nil, so that SQL uses the database's now(), unless a test clock is set.
func (p *Postgres) clockArg() any {
	if p.clock != nil {
		return p.clock().UnixNano()
	}
	return nil
}

// leaseEnd turns a lease end given by the caller (by its clock) into the
// parameters of `coalesce($abs, now_ns() + $rel)`: the same span from
// the database's now(). With a test clock the end is taken as given.
func (p *Postgres) leaseEnd(until time.Time) (abs any, rel int64) {
	if p.clock != nil {
		return until.UnixNano(), 0
	}
	return nil, int64(time.Until(until))
}

// op runs fn unless the store is closed. A connection failure marks the
// store unavailable at once (the loops pause); the monitor marks it
// available again when the database answers.
func (p *Postgres) op(fn func() error) error {
	if p.closed.Load() {
		return store.ErrClosed
	}
	err := fn()
	if err != nil && p.closed.Load() {
		return store.ErrClosed
	}
	if err != nil && (connectionLost(err) || isNotDurable(err)) {
		p.available.Store(false)
	}
	if err != nil {
		p.pool.notePreparedStatementError(err)
	}
	return err
}

// connectionLost reports whether err means the database could not be
// reached or the connection broke (not an answer of the server).
func connectionLost(err error) bool {
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "conn closed")
}

// tx runs fn in a write transaction (READ COMMITTED; rows are locked
// where it matters; opened by pgDB.begin, so refused when
// synchronous_commit is off) and commits; fn's error rolls back and is
// returned.
func (p *Postgres) tx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	return p.op(func() error { return p.runTx(ctx, nil, fn) })
}

// runTx runs fn in a write transaction on a connection of its own and
// commits, recording in c (if not nil) the transaction's id and whether
// COMMIT was sent.
func (p *Postgres) runTx(ctx context.Context, c *pgCommit, fn func(tx pgx.Tx) error) error {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // a connection left in a transaction is destroyed, not pooled
	tx, err := p.pool.begin(ctx, conn, c)
	if tx != nil {
		defer func() { // nothing after a commit
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
		}()
	}
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	if c != nil {
		c.sent = true
	}
	return tx.Commit(ctx)
}

// exec runs one write statement as a write transaction of its own
// (runTx); the caller runs it in op.
func (p *Postgres) exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	var tag pgconn.CommandTag
	err := p.runTx(ctx, nil, func(tx pgx.Tx) error {
		var err error
		tag, err = tx.Exec(ctx, sql, args...)
		return err
	})
	return tag, err
}

// The columns of a record, in the order scanRecord reads them.
const pgRecordCols = `provider, id, code, answer, source, received_at, submitted_at, server, request,
	state, attempts, failures, interrupts, due_at, lease_owner, lease_until, last_status, last_error, updated_at, expires_at, history,
	verified, tracked, quarantine, other_code, correction, payload_erased, expired_reason`

// The columns of a delivery state, in the order scanDelivery reads them.
const pgDeliveryCols = `state, attempts, failures, interrupts, due_at, lease_owner, lease_until, last_status, last_error, updated_at, history, expired_reason`

func scanRecord(row pgx.Row) (*store.Record, error) {
	var r store.Record
	var code, req, other []byte
	var received, sub, expires *int64
	var d pgDelivery
	err := row.Scan(&r.Provider, &r.ID, &code, &r.Answer, &r.Source, &received, &sub, &r.Server, &req,
		&d.State, &d.Attempts, &d.Failures, &d.Interrupts, &d.due, &d.owner, &d.until, &d.LastStatus, &d.LastError, &d.updated, &expires, &d.history,
		&r.Verified, &r.Tracked, &r.Quarantine, &other, &r.Correction, &r.PayloadErased, &d.ExpiredReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	r.Code, r.OtherCode = string(code), string(other)
	if err := json.Unmarshal(req, &r.Request); err != nil {
		return nil, fmt.Errorf("decoding stored request of %s:%s: %w", r.Provider, r.ID, err)
	}
	r.ReceivedAt, r.SubmittedAt, r.ExpiresAt = fromNS(received), fromNS(sub), fromNS(expires)
	if r.Delivery, err = d.delivery(); err != nil {
		return nil, fmt.Errorf("decoding history of %s:%s: %w", r.Provider, r.ID, err)
	}
	return &r, nil
}

// pgDelivery is a delivery state as scanned, nullable columns apart.
type pgDelivery struct {
	store.Delivery
	due, until, updated *int64
	owner               *string
	history             []byte // JSON, nil for none
}

func (d *pgDelivery) delivery() (store.Delivery, error) {
	out := d.Delivery
	out.UpdatedAt, out.DueAt = fromNS(d.updated), fromNS(d.due)
	if d.owner != nil && d.until != nil {
		out.Lease = store.Lease{Owner: *d.owner, Until: fromNS(d.until)}
	}
	if len(d.history) > 0 {
		if err := json.Unmarshal(d.history, &out.History); err != nil {
			return out, err
		}
	}
	return out, nil
}

// historyJSON is the history column's value: JSON, nil for none.
func historyJSON(h []store.Attempt) []byte {
	if len(h) == 0 {
		return nil
	}
	b, _ := json.Marshal(h) // attempts always encode
	return b
}

// ns is t as a query parameter: Unix nanoseconds, NULL for the zero time.
func ns(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return pgNano(t)
}

// The times a nanosecond column can hold (UnixNano's range, years 1678 to
// 2262).
var (
	minNS = time.Unix(0, math.MinInt64)
	maxNS = time.Unix(0, math.MaxInt64)
)

// pgNano is t in Unix nanoseconds, clamped to the int64 range: outside
// it UnixNano wraps (year 1 would read back as a time in 1754 or so, and
// an expires_at far in the past as one far in the future).
func pgNano(t time.Time) int64 {
	switch {
	case t.Before(minNS):
		return math.MinInt64
	case t.After(maxNS):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// fromNS is the time of a nanosecond column; NULL is the zero time.
func fromNS(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return time.Unix(0, *v).UTC()
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// Insert implements Store: group-committed with the inserts waiting at
// the same time (insertBatch): under a transaction-level advisory lock on
// the key (shared with AddTask, so a task and its result never miss each
// other), the insert (nothing on a conflict) and the pending task marked
// done, in one transaction. A forwarding record's lease ends by the
// database's clock: Until is taken relative to this process's clock.
func (p *Postgres) Insert(ctx context.Context, rec *store.Record) (store.InsertResult, error) {
	c := *rec
	if c.State == store.StateForwarding {
		c.Lease.Owner = p.owner
		c.DueAt = time.Time{}
	} else {
		c.Lease = store.Lease{}
	}
	req, err := json.Marshal(&c.Request)
	if err != nil {
		return store.InsertResult{}, fmt.Errorf("encoding request: %w", err)
	}
	if size := len(req) + len(c.Code) + len(c.Answer) + len(c.LastError) + 512; size > store.MaxRecordSize {
		return store.InsertResult{}, fmt.Errorf("%w: %d bytes encoded, at most %d", store.ErrTooLarge, size, store.MaxRecordSize)
	}
	var res store.InsertResult
	err = p.op(func() error {
		op, err := p.inserts.do(ctx, &pgInsert{rec: &c, req: req})
		if err != nil {
			return err
		}
		res = op.in.res
		return nil
	})
	if err != nil {
		return store.InsertResult{}, err
	}
	return res, nil
}

// Get implements Store.
func (p *Postgres) Get(ctx context.Context, key store.Key) (*store.Record, error) {
	var rec *store.Record
	err := p.op(func() error {
		var err error
		rec, err = scanRecord(p.pool.QueryRow(ctx, `SELECT `+pgRecordCols+` FROM records WHERE provider = $1 AND id = $2`, key.Provider, key.ID))
		if errors.Is(err, store.ErrNotFound) {
			err = p.isPurged(ctx, key)
		}
		return err
	})
	return rec, err
}

// queueDelivery queues the update of key's delivery state to d.
func queueDelivery(b *pgx.Batch, key store.Key, d *store.Delivery) {
	b.Queue(`UPDATE records SET state = $3, attempts = $4, failures = $5, interrupts = $6, due_at = $7,
		lease_owner = $8, lease_until = $9, last_status = $10, last_error = $11, updated_at = $12, history = $13,
		expired_reason = $14
		WHERE provider = $1 AND id = $2`,
		key.Provider, key.ID, string(d.State), d.Attempts, d.Failures, d.Interrupts, ns(d.DueAt),
		nullString(d.Lease.Owner), ns(d.Lease.Until), d.LastStatus, d.LastError, ns(d.UpdatedAt), historyJSON(d.History),
		d.ExpiredReason)
}

// UpdateDelivery implements Store: group-committed with the updates
// waiting at the same time (updateBatch); the row is locked (FOR UPDATE)
// while fn runs, so concurrent updates from any instance apply one after
// another.
func (p *Postgres) UpdateDelivery(ctx context.Context, key store.Key, fn func(*store.Delivery) error) (store.Delivery, error) {
	var result store.Delivery
	err := p.op(func() error {
		op, err := p.updates.do(ctx, &pgUpdate{key: key, fn: fn})
		if op != nil {
			result = op.in.result
		}
		return err
	})
	return result, err
}

// UpdateRecord implements Store: the key's advisory lock (shared with
// Insert and AddTask, so a task and its result never miss each other) and
// the row lock are held while fn runs; a record leaving quarantine marks
// its pending task done in the same transaction, unless it was received
// before the task was submitted.
func (p *Postgres) UpdateRecord(ctx context.Context, key store.Key, fn func(*store.Record) error) (*store.Record, error) {
	var result *store.Record
	err := p.readModifyWriteLocked(ctx, &key, `SELECT `+pgRecordCols+` FROM records WHERE provider = $1 AND id = $2 FOR UPDATE`,
		[]any{key.Provider, key.ID}, func(row pgx.Row, b *pgx.Batch) error {
			old, cur, err := store.ApplyUpdate(func() (*store.Record, error) { return scanRecord(row) }, fn, store.KeepRecord(key, p.owner))
			result = old // what a failed update answers
			if err != nil {
				return err
			}
			req, err := json.Marshal(&cur.Request)
			if err != nil {
				return fmt.Errorf("encoding request: %w", err)
			}
			if size := len(req) + len(cur.Code) + len(cur.Answer) + len(cur.OtherCode) + len(cur.LastError) + 512; size > store.MaxRecordSize {
				return fmt.Errorf("%w: %d bytes encoded, at most %d", store.ErrTooLarge, size, store.MaxRecordSize)
			}
			var other any
			if cur.OtherCode != "" {
				other = []byte(cur.OtherCode)
			}
			b.Queue(`UPDATE records SET code = $3, answer = $4, source = $5, received_at = $6,
				submitted_at = coalesce((SELECT submitted_at FROM tasks WHERE provider = $1 AND id = $2), $7), server = $8, request = $9,
				state = $10, attempts = $11, failures = $12, interrupts = $13, due_at = $14, lease_owner = $15, lease_until = $16,
				last_status = $17, last_error = $18, updated_at = $19, expires_at = $20,
				verified = $21, tracked = $22, quarantine = $23, other_code = $24, correction = $25, history = $26,
				payload_erased = $27, expired_reason = $28
				WHERE provider = $1 AND id = $2`,
				key.Provider, key.ID, []byte(cur.Code), cur.Answer, string(cur.Source), ns(cur.ReceivedAt), ns(cur.SubmittedAt), cur.Server, req,
				string(cur.State), cur.Attempts, cur.Failures, cur.Interrupts, ns(cur.DueAt), nullString(cur.Lease.Owner), ns(cur.Lease.Until),
				cur.LastStatus, cur.LastError, ns(cur.UpdatedAt), pgNano(cur.ExpiresAt),
				cur.Verified, cur.Tracked, cur.Quarantine, other, cur.Correction, historyJSON(cur.History),
				cur.PayloadErased, cur.ExpiredReason)
			// The task after the record, as the insert batch orders them:
			// the count triggers then take record rows before task rows in
			// every transaction, so two never wait for each other's.
			if old.State == store.StateQuarantined && cur.State != store.StateQuarantined {
				b.Queue(`UPDATE tasks SET state = 'done', next_poll_at = NULL, updated_at = $3, result_at = $3
					WHERE provider = $1 AND id = $2 AND state = 'pending' AND coalesce(submitted_at, 0) <= $3`,
					key.Provider, key.ID, cur.ReceivedAt.UnixNano())
			}
			result = cur
			return nil
		})
	return result, err
}

// readModifyWrite runs one locked read-modify-write transaction in two
// round trips: BEGIN and the locking query, then the writes fn queues on b
// and COMMIT. If fn fails the transaction is rolled back and fn's error
// returned.
func (p *Postgres) readModifyWrite(ctx context.Context, query string, args []any, fn func(row pgx.Row, b *pgx.Batch) error) error {
	return p.readModifyWriteLocked(ctx, nil, query, args, fn)
}

// readModifyWriteLocked is readModifyWrite that first takes the advisory
// lock of lock (if not nil), the one Insert and AddTask take.
func (p *Postgres) readModifyWriteLocked(ctx context.Context, lock *store.Key, query string, args []any, fn func(row pgx.Row, b *pgx.Batch) error) error {
	return p.op(func() error {
		conn, err := p.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		read := &pgx.Batch{}
		p.pool.queueBegin(read)
		if lock != nil {
			read.Queue(`SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`, lock.Provider, lock.ID)
		}
		read.Queue(query, args...)
		br := conn.SendBatch(ctx, read)
		if err := p.pool.readBegin(br, nil); err != nil {
			br.Close()
			return err
		}
		if lock != nil {
			if _, err := br.Exec(); err != nil {
				br.Close()
				return err
			}
		}
		write := &pgx.Batch{}
		fnErr := fn(br.QueryRow(), write)
		if err := br.Close(); err != nil && fnErr == nil {
			fnErr = err
		}
		if fnErr != nil {
			// A connection left inside a transaction must not go back
			// to the pool: roll back, or close it.
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := conn.Exec(rctx, "ROLLBACK"); err != nil {
				_ = conn.Conn().Close(rctx)
			}
			return fnErr
		}
		write.Queue("COMMIT")
		if err := conn.SendBatch(ctx, write).Close(); err != nil {
			if !conn.Conn().PgConn().IsClosed() && conn.Conn().PgConn().TxStatus() != 'I' {
				rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if _, rerr := conn.Exec(rctx, "ROLLBACK"); rerr != nil {
					_ = conn.Conn().Close(rctx)
				}
			}
			return err
		}
		return nil
	})
}

// Claim implements Store. The time is the database's (now(), one value
// for the whole claim): due records are those whose DueAt is at or before
// it, and a lease runs req.Lease from it; req.Now is not used. Lapsed
// leases come first (oldest end first), then req.Reserved due records
// with at most FewFailures failures (records_fair), then due records
// (earliest first), each pass skipping rows of routes without room (see
// pgClaimScan.pass); rows another instance is claiming are skipped (FOR
// UPDATE SKIP LOCKED), so every record goes to one claimer. By keys, rows
// are locked in key order and waited for.
func (p *Postgres) Claim(ctx context.Context, req store.ClaimRequest) ([]*store.Record, error) {
	if !req.Valid() {
		return nil, errors.New("claim: need a positive limit and a decide function")
	}
	clock := p.clockArg()
	var out []*store.Record
	err := p.txRetry(ctx, "claim", func(tx pgx.Tx) error {
		out = nil
		var nowNS int64
		if err := tx.QueryRow(ctx, `SELECT coalesce($1::bigint, now_ns())`, clock).Scan(&nowNS); err != nil {
			return err
		}
		now := fromNS(&nowNS)
		cands, err := p.claimable(ctx, tx, req, now)
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		for _, rec := range cands {
			lapsed := rec.State == store.StateForwarding
			if lapsed && rec.Lease.Until.After(now) {
				continue // a live lease: named by key, not claimable
			}
			cur := rec.Delivery
			if lapsed {
				cur.LastStatus, cur.LastError = 0, store.LapseExpired
				cur.Lease = store.Lease{}
			}
			req.Apply(rec, &cur, lapsed)
			if cur.State == store.StateForwarding {
				cur.Lease = store.Lease{Owner: p.owner, Until: now.Add(req.Lease)}
			}
			cur.OwnLease(p.owner)
			queueDelivery(b, rec.Key(), &cur)
			rec.Delivery = cur
			out = append(out, rec)
		}
		if b.Len() == 0 {
			return nil
		}
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// claimable returns the locked candidate rows of a claim at now.
func (p *Postgres) claimable(ctx context.Context, tx pgx.Tx, req store.ClaimRequest, now time.Time) ([]*store.Record, error) {
	if len(req.Keys) > 0 {
		// Each record once, however often it is named: a claim that
		// returned a record twice would forward it twice.
		var keys []store.Key
		named := map[store.Key]bool{}
		for _, k := range req.Keys {
			if len(keys) == req.Limit {
				break
			}
			if !named[k] {
				named[k] = true
				keys = append(keys, k)
			}
		}
		provs, ids := make([]string, len(keys)), make([]string, len(keys))
		for i, k := range keys {
			provs[i], ids[i] = k.Provider, k.ID
		}
		recs, err := p.queryRecords(ctx, tx, `SELECT `+pgRecordCols+` FROM records
			WHERE (provider, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
			ORDER BY provider, id FOR UPDATE`, provs, ids)
		if err != nil {
			return nil, err
		}
		// In the order named.
		slices.SortFunc(recs, func(a, b *store.Record) int {
			return slices.Index(keys, a.Key()) - slices.Index(keys, b.Key())
		})
		return recs, nil
	}
	c := &pgClaimScan{p: p, ctx: ctx, tx: tx, req: &req, now: now.UnixNano(), skip: append([]string{}, req.SkipProviders...)}
	if req.Route != nil && len(req.Room) > 0 {
		c.room = make(map[string]int, len(req.Room))
		for r, n := range req.Room {
			c.room[r] = n
		}
	}
	if err := c.pass(pgLapsedPass, req.Limit); err != nil {
		return nil, err
	}
	if left := req.Limit - len(c.out); req.Reserved > 0 && left > 0 {
		if err := c.pass(pgFairPass, min(req.Reserved, left)); err != nil {
			return nil, err
		}
	}
	if left := req.Limit - len(c.out); left > 0 {
		if err := c.pass(pgDuePass, left); err != nil {
			return nil, err
		}
	}
	return c.out, nil
}

// pgClaimPass is a pass of a claim: which rows it takes (where, with $1
// the claim's time in Unix nanoseconds) and the column they are taken in
// the order of (then provider and id).
type pgClaimPass struct{ where, order string }

// The passes of a claim without keys. The fair pass's condition is the
// predicate of the records_fair index (0008_fair_claims.sql), FewFailures
// written out.
var (
	pgLapsedPass = pgClaimPass{where: `state = 'forwarding' AND lease_until <= $1`, order: "lease_until"}
	pgFairPass   = pgClaimPass{where: `state IN ('queued', 'failed') AND failures <= ` + strconv.Itoa(store.FewFailures) + ` AND due_at <= $1`, order: "due_at"}
	pgDuePass    = pgClaimPass{where: `state IN ('queued', 'failed') AND due_at <= $1`, order: "due_at"}
)

// query is the pass's query of a chunk: $1 the claim's time, $2 and $3
// the providers and ids to leave out, $4 the chunk's size, $5 the
// providers skipped (ClaimRequest.SkipProviders) and, after the first
// chunk, $6 to $8 the order column, provider and id of the last row read.
func (x pgClaimPass) query(after bool) string {
	q := `SELECT ` + pgRecordCols + ` FROM records WHERE ` + x.where + `
		AND (provider, id) NOT IN (SELECT * FROM unnest($2::text[], $3::text[]))
		AND provider <> ALL($5::text[])`
	if after {
		q += ` AND ` + x.order + ` >= $6 AND (` + x.order + `, provider, id) > ($6, $7, $8)`
	}
	return q + ` ORDER BY ` + x.order + `, provider, id LIMIT $4 FOR UPDATE SKIP LOCKED`
}

// pgClaimScan is one claim's rows being gathered: those taken so far, in
// order, and the room left to each limited route.
type pgClaimScan struct {
	p     *Postgres
	ctx   context.Context
	tx    pgx.Tx
	req   *store.ClaimRequest
	now   int64
	room  map[string]int // nil: no route is limited
	out   []*store.Record
	provs []string // the keys of out, for the next pass to leave out
	ids   []string
	skip  []string // ClaimRequest.SkipProviders, never nil (an empty array)
}

// pass takes up to need rows of pass x, locked (FOR UPDATE SKIP LOCKED:
// rows another claim holds are not seen), leaving out the rows an earlier
// pass took. A row of a route without room is skipped (it stays locked
// until the claim commits, unchanged). The rows are read a chunk at a time
// after the last one read, and the pass stops once it took need rows or
// examined need+ClaimSkipBudget.
func (c *pgClaimScan) pass(x pgClaimPass, need int) error {
	budget := need + store.ClaimSkipBudget
	examined, took := 0, 0
	var after *store.Record
	for took < need && examined < budget {
		chunk := min(budget-examined, max(need-took, 16))
		if c.room == nil {
			chunk = need - took // nothing is skipped
		}
		args := []any{c.now, c.provs, c.ids, chunk, c.skip}
		if after != nil {
			at := after.DueAt
			if x.order == "lease_until" {
				at = after.Lease.Until
			}
			args = append(args, at.UnixNano(), after.Provider, after.ID)
		}
		q := x.query(after != nil)
		rows, err := c.p.queryRecords(c.ctx, c.tx, q, args...)
		if err != nil {
			return err
		}
		for _, rec := range rows {
			if took >= need {
				break
			}
			examined++
			after = rec
			if !c.hasRoom(rec) {
				continue
			}
			took++
			c.out = append(c.out, rec)
			c.provs, c.ids = append(c.provs, rec.Provider), append(c.ids, rec.ID)
		}
		if len(rows) < chunk {
			return nil
		}
	}
	return nil
}

// hasRoom reports whether rec's route may give this claim one more
// record, and counts it if so.
func (c *pgClaimScan) hasRoom(rec *store.Record) bool {
	if c.room == nil {
		return true
	}
	r := c.req.Route(rec)
	n, limited := c.room[r]
	if !limited {
		return true
	}
	if n <= 0 {
		return false
	}
	c.room[r] = n - 1
	return true
}

func (p *Postgres) queryRecords(ctx context.Context, tx pgx.Tx, sql string, args ...any) ([]*store.Record, error) {
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.Record
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Renew implements Store. The lease is extended to until measured from
// this process's clock and applied to the database's: it ends
// until − (local now) after the database's now(). (A forward's lease is
// renewed every third of its term, so clock skew between instances never
// matters: only spans cross the wire.)
func (p *Postgres) Renew(ctx context.Context, key store.Key, attempt int, until time.Time) error {
	abs, rel := p.leaseEnd(until)
	return p.op(func() error {
		tag, err := p.exec(ctx, `UPDATE records
			SET lease_until = coalesce($5::bigint, now_ns() + $6::bigint)
			WHERE provider = $1 AND id = $2 AND state = 'forwarding' AND attempts = $3 AND lease_owner = $4`,
			key.Provider, key.ID, attempt, p.owner, abs, rel)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.ErrLeaseLost
		}
		return nil
	})
}

// expireBatches bounds the transactions of one Expire call: 100 of up to
// limit rows each (100,000 records at the app's limit of 1,000), eight
// times what a minute of 200 pingbacks a second leaves to expire, so that
// the once-a-minute housekeeping keeps up with a busy store and a backlog
// (a store that was down) drains over a few rounds without holding the
// replay loop's other chores for long.
const expireBatches = 100

// Expire implements Store: it deletes the records (and tasks, and purge
// tombstones) whose retention ended at or before now, in transactions of
// up to limit rows each, and reports the undelivered records among them,
// at most limit: it goes on while a transaction found a full batch to
// delete and fewer than limit are reported, for at most expireBatches
// transactions. Delivered records are deleted without being reported, so
// a caller that loops while a call reports limit results (the app's
// housekeeping) does not stop after the first batch of delivered ones
// (before, a store taking more than limit results a minute, 17 a second at
// the app's 1,000, grew without end). One instance sweeps at a time (a
// transaction-level advisory lock); another that asks meanwhile gets
// nothing, and sweeps at its next round.
func (p *Postgres) Expire(ctx context.Context, now time.Time, limit int) ([]store.Expired, error) {
	var out []store.Expired
	for range expireBatches {
		n := limit - len(out)
		if n <= 0 {
			break
		}
		gone, full, err := p.expireBatch(ctx, now, n)
		out = append(out, gone...)
		if err != nil || !full {
			return out, err
		}
	}
	return out, nil
}

// expireBatch is one transaction of Expire: it deletes up to limit expired
// records, limit expired tasks and limit expired purge tombstones, and
// returns the undelivered records deleted, and whether any of the three
// deletes found limit rows (there may be more).
func (p *Postgres) expireBatch(ctx context.Context, now time.Time, limit int) ([]store.Expired, bool, error) {
	var out []store.Expired
	var full bool
	err := p.tx(ctx, func(tx pgx.Tx) error {
		out, full = nil, false
		var got bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(hashtextextended('caddy-pingback expire ' || current_schema(), 0))`).Scan(&got); err != nil {
			return err
		}
		if !got {
			return nil
		}
		rows, err := tx.Query(ctx, `DELETE FROM records WHERE (provider, id) IN (
				SELECT provider, id FROM records WHERE expires_at <= $1
				ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)
			RETURNING provider, id, state`, now.UnixNano(), limit)
		if err != nil {
			return err
		}
		deleted := 0
		for rows.Next() {
			var e store.Expired
			if err := rows.Scan(&e.Key.Provider, &e.Key.ID, &e.State); err != nil {
				rows.Close()
				return err
			}
			deleted++
			if e.State != store.StateDelivered {
				out = append(out, e)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		full = deleted == limit
		tag, err := tx.Exec(ctx, `DELETE FROM tasks WHERE (provider, id) IN (
				SELECT provider, id FROM tasks WHERE expires_at <= $1
				ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, now.UnixNano(), limit)
		if err != nil {
			return err
		}
		full = full || tag.RowsAffected() == int64(limit)
		tag, err = tx.Exec(ctx, `DELETE FROM purged WHERE (provider, id) IN (
				SELECT provider, id FROM purged WHERE expires_at <= $1
				ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, now.UnixNano(), limit)
		full = full || err == nil && tag.RowsAffected() == int64(limit)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	return out, full, nil
}

// List implements Store.
func (p *Postgres) List(ctx context.Context, f store.Filter, limit int) ([]*store.Record, error) {
	var out []*store.Record
	err := p.op(func() error {
		rows, err := p.pool.Query(ctx, `SELECT `+pgRecordCols+` FROM records
			WHERE ($1 = '' OR provider = $1) AND ($2 = '' OR state = $2)
			ORDER BY provider, id LIMIT $3`, f.Provider, string(f.State), limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r, err := scanRecord(rows)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	return out, err
}

// Interface guards
var _ store.Store = (*Postgres)(nil)
