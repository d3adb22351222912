package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
)

// Group commit on PostgreSQL. Concurrent inserts, and concurrent delivery
// updates, are gathered by a few committer goroutines into one transaction
// each: a multi-row statement over unnest()ed arrays, so that two round
// trips and one WAL flush carry every waiting pingback (the server's own
// group commit shares flushes between connections too, but each
// transaction still costs its statements and context switches on the
// server). A failed commit fails every operation of its batch; nothing of
// it is stored. A batch that fails on a transient fault is retried once
// where it is committed, so every waiting operation gets the retry's
// result ([Postgres.retryTransient], [Postgres.afterFailure]).

// Batching limits.
const (
	pgBatchMax     = 128 // operations per transaction
	pgCommitters   = 4   // transactions in flight per kind of operation
	pgBatchTimeout = 30 * time.Second
	// pgLazyWait is how long a batch of only deferrable operations (a
	// live forward's outcome, Deferrable) waits for more before its
	// transaction starts: under load the outcomes of many pingbacks then
	// share one transaction, where each took a share of a small batch of
	// its own. An operation someone waits on ends the wait at once.
	pgLazyWait = 5 * time.Millisecond
)

// pgOp is one queued operation and its result. ctx is its caller's:
// a retry after a transient fault runs only within its deadline.
type pgOp[T any] struct {
	ctx  context.Context
	in   T
	err  error
	done chan struct{}
	lazy bool // no caller waits for it to answer anyone (Deferrable)
}

// pgBatcher runs queued operations in batches: pgCommitters batches at
// once, each one transaction, gathered by a store.Committer.
type pgBatcher[T any] struct {
	committer *store.Committer[*pgOp[T]]
	run       func(ctx context.Context, ops []*pgOp[T]) error // sets per-op results; an error fails them all
}

// newPGBatcher starts pgCommitters loops running batches of up to
// pgBatchMax operations with run; a batch of only deferrable operations
// waits up to wait for more (an operation someone waits on ends the wait).
func newPGBatcher[T any](run func(ctx context.Context, ops []*pgOp[T]) error, wait time.Duration) *pgBatcher[T] {
	b := &pgBatcher[T]{run: run}
	b.committer = store.NewCommitter(store.CommitterConfig[*pgOp[T]]{
		Commit:   b.commit,
		Loops:    pgCommitters,
		MaxOps:   pgBatchMax,
		Lazy:     func(op *pgOp[T]) bool { return op.lazy },
		LazyWait: wait,
	})
	return b
}

// do queues in and waits for its batch's commit.
func (b *pgBatcher[T]) do(ctx context.Context, in T) (*pgOp[T], error) {
	op := &pgOp[T]{ctx: ctx, in: in, done: make(chan struct{}), lazy: store.IsDeferrable(ctx)}
	if err := b.committer.Submit(op); err != nil {
		return nil, err
	}
	<-op.done
	return op, op.err
}

// commit runs one batch as one transaction (within pgBatchTimeout): a
// failed run fails every operation of the batch. It then releases them all.
func (b *pgBatcher[T]) commit(ops []*pgOp[T]) {
	ctx, cancel := context.WithTimeout(context.Background(), pgBatchTimeout)
	if err := b.run(ctx, ops); err != nil {
		for _, o := range ops {
			o.err = err
		}
	}
	cancel()
	for _, o := range ops {
		close(o.done)
	}
}

// close runs what is queued, then stops the committers.
func (b *pgBatcher[T]) close() { b.committer.Close() }

// pgInsert is one Insert: the record as stored (lease owner set) and its
// encoded request; the result is filled in by the batch.
type pgInsert struct {
	rec *store.Record
	req []byte
	res store.InsertResult
	dup bool // not inserted: res is read after the commit
}

// insertBatch stores a batch of records (insertAttempt), retried once
// after a transient fault for the inserts whose context has time left
// (insertRetryWindow); a connection lost after COMMIT was sent is a
// commit if the database says the transaction committed. Duplicates then
// read the stored record.
func (p *Postgres) insertBatch(ctx context.Context, ops []*pgOp[*pgInsert]) error {
	c := &pgCommit{}
	err := p.insertAttempt(ctx, ops, c)
	committed, retry := p.afterFailure(ctx, "insert", err, c)
	switch {
	case committed:
		err = nil
	case retry:
		live, rctx, cancel := insertRetryWindow(ctx, ops, err)
		defer cancel()
		if len(live) == 0 {
			return err
		}
		ops = live
		err = p.insertAttempt(rctx, ops, &pgCommit{})
	}
	if err != nil {
		return err
	}
	for _, op := range ops {
		if !op.in.dup || op.err != nil {
			continue
		}
		op.err = p.retryTransient(ctx, "reading a duplicate", func(ctx context.Context, _ *pgCommit) error {
			old, err := scanRecord(p.pool.QueryRow(ctx, `SELECT `+pgRecordCols+` FROM records WHERE provider = $1 AND id = $2`, op.in.rec.Provider, op.in.rec.ID))
			if errors.Is(err, store.ErrNotFound) {
				// Not inserted and not stored: its key was purged.
				res, perr := p.purgedExisting(ctx, op.in.rec)
				if perr == nil {
					op.in.res = res
					return nil
				}
			}
			if err != nil {
				return errors.Join(errors.New("reading the stored duplicate"), err)
			}
			op.in.res = store.InsertResult{Existing: old}
			return nil
		})
	}
	return nil
}

// insertRetryWindow returns the inserts of a batch that still have time
// for a retry, and the context the retry runs in: ctx, ending at the
// latest of their deadlines. The others fail with err.
func insertRetryWindow(ctx context.Context, ops []*pgOp[*pgInsert], err error) ([]*pgOp[*pgInsert], context.Context, context.CancelFunc) {
	var live []*pgOp[*pgInsert]
	var last time.Time
	bounded := true
	for _, op := range ops {
		if op.ctx.Err() != nil {
			op.err = err
			continue
		}
		d, ok := op.ctx.Deadline()
		if !ok {
			bounded = false
		} else if d.After(last) {
			last = d
		}
		live = append(live, op)
	}
	if !bounded || len(live) == 0 {
		return live, ctx, func() {}
	}
	rctx, cancel := context.WithDeadline(ctx, last)
	return live, rctx, cancel
}

// insertAttempt stores a batch of records in one transaction of two round
// trips on one connection: BEGIN, the search_path, the transaction's id
// (for c) and its synchronous_commit (pgDB.queueBegin), the keys'
// advisory locks (shared with AddTask), the submission times of their
// tracked tasks, the insert (nothing for a key already stored) and the
// pending tasks marked done; then COMMIT. It sets every op's result,
// marking duplicates.
func (p *Postgres) insertAttempt(ctx context.Context, ops []*pgOp[*pgInsert], c *pgCommit) error {
	n := len(ops)
	keys := make([]store.Key, 0, n)
	var (
		provs, ids, sources, servers, states, lastErrs []string
		verifieds, quarantines, expiredReasons         []string
		trackeds, corrections, erased                  []bool
		codes, answers, reqs, others, histories        [][]byte
		received, subs, dues, abs, updated             []*int64
		rel, expires                                   []int64
		attempts, failures, interrupts, lastStatus     []int32
		owners                                         []*string
	)
	for _, op := range ops {
		c := op.in.rec
		keys = append(keys, c.Key())
		provs, ids = append(provs, c.Provider), append(ids, c.ID)
		codes, answers, reqs = append(codes, []byte(c.Code)), append(answers, c.Answer), append(reqs, op.in.req)
		sources, servers = append(sources, string(c.Source)), append(servers, c.Server)
		received, subs = append(received, nsPtr(c.ReceivedAt)), append(subs, nsPtr(c.SubmittedAt))
		states = append(states, string(c.State))
		attempts, failures, interrupts = append(attempts, int32(c.Attempts)), append(failures, int32(c.Failures)), append(interrupts, int32(c.Interrupts))
		dues = append(dues, nsPtr(c.DueAt))
		var owner *string
		var a *int64
		var r int64
		if c.State == store.StateForwarding {
			owner = &c.Lease.Owner
			av, rv := p.leaseEnd(c.Lease.Until)
			if av != nil {
				v := av.(int64)
				a = &v
			}
			r = rv
		}
		owners, abs, rel = append(owners, owner), append(abs, a), append(rel, r)
		lastStatus, lastErrs = append(lastStatus, int32(c.LastStatus)), append(lastErrs, c.LastError)
		updated, expires = append(updated, nsPtr(c.UpdatedAt)), append(expires, pgNano(c.ExpiresAt))
		histories = append(histories, historyJSON(c.History))
		verifieds, quarantines = append(verifieds, c.Verified), append(quarantines, c.Quarantine)
		trackeds, corrections = append(trackeds, c.Tracked), append(corrections, c.Correction)
		erased = append(erased, c.PayloadErased)
		expiredReasons = append(expiredReasons, c.ExpiredReason)
		var other []byte
		if c.OtherCode != "" {
			other = []byte(c.OtherCode)
		}
		others = append(others, other)
	}
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, store.CompareKeys)
	lockProvs, lockIDs := make([]string, n), make([]string, n)
	for i, k := range sorted {
		lockProvs[i], lockIDs[i] = k.Provider, k.ID
	}

	b := &pgx.Batch{}
	p.pool.queueBegin(b)
	b.Queue(`SELECT count(pg_advisory_xact_lock(hashtext(p), hashtext(i)))
		FROM (SELECT p, i FROM unnest($1::text[], $2::text[]) AS k(p, i) ORDER BY p, i) s`, lockProvs, lockIDs)
	b.Queue(`SELECT provider, id, submitted_at FROM tasks
		WHERE (provider, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, provs, ids)
	b.Queue(`INSERT INTO records (`+pgRecordCols+`)
		SELECT u.provider, u.id, u.code, u.answer, u.source, u.received_at, coalesce(t.submitted_at, u.submitted_at), u.server, u.request,
			u.state, u.attempts, u.failures, u.interrupts, u.due_at, u.lease_owner,
			CASE WHEN u.lease_owner IS NOT NULL THEN coalesce(u.lease_abs, now_ns() + u.lease_rel) END,
			u.last_status, u.last_error, u.updated_at, u.expires_at, u.history,
			u.verified, u.tracked OR (t.id IS NOT NULL AND u.state <> 'quarantined' AND coalesce(t.submitted_at, 0) <= u.received_at),
			u.quarantine, u.other_code, u.correction, u.payload_erased, u.expired_reason
		FROM unnest($1::text[], $2::text[], $3::bytea[], $4::text[], $5::bigint[], $6::bigint[], $7::text[], $8::bytea[],
			$9::text[], $10::int[], $11::int[], $12::int[], $13::bigint[], $14::text[], $15::bigint[], $16::bigint[],
			$17::int[], $18::text[], $19::bigint[], $20::bigint[], $21::bytea[], $22::bytea[],
			$23::text[], $24::bool[], $25::text[], $26::bytea[], $27::bool[], $28::bool[], $29::text[])
			WITH ORDINALITY AS u(provider, id, code, source, received_at, submitted_at, server, request,
				state, attempts, failures, interrupts, due_at, lease_owner, lease_abs, lease_rel,
				last_status, last_error, updated_at, expires_at, answer, history,
				verified, tracked, quarantine, other_code, correction, payload_erased, expired_reason, ord)
		LEFT JOIN tasks t ON t.provider = u.provider AND t.id = u.id
		WHERE NOT EXISTS (SELECT 1 FROM purged g WHERE g.provider = u.provider AND g.id = u.id)
		ORDER BY u.ord
		ON CONFLICT (provider, id) DO NOTHING
		RETURNING provider, id`,
		provs, ids, codes, sources, received, subs, servers, reqs,
		states, attempts, failures, interrupts, dues, owners, abs, rel,
		lastStatus, lastErrs, updated, expires, answers, histories,
		verifieds, trackeds, quarantines, others, corrections, erased, expiredReasons)
	// Only results inserted now complete their tasks (a duplicate's task
	// was settled by the first), never quarantined ones, nor results
	// received before their task was submitted.
	b.Queue(`UPDATE tasks t SET state = 'done', next_poll_at = NULL, updated_at = u.received, result_at = u.received
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[]) AS u(provider, id, received, state)
		WHERE t.provider = u.provider AND t.id = u.id AND t.state = 'pending'
			AND u.state <> 'quarantined' AND coalesce(t.submitted_at, 0) <= u.received`, provs, ids, received, states)

	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // a connection left in a transaction is destroyed, not pooled
	tracked := map[store.Key]time.Time{}
	inserted := map[store.Key]bool{}
	br := conn.SendBatch(ctx, b)
	err = func() error {
		if err := p.pool.readBegin(br, c); err != nil {
			return err
		}
		if _, err := br.Exec(); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var k store.Key
			var sub *int64
			if err := rows.Scan(&k.Provider, &k.ID, &sub); err != nil {
				rows.Close()
				return err
			}
			tracked[k] = fromNS(sub)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if rows, err = br.Query(); err != nil {
			return err
		}
		for rows.Next() {
			var k store.Key
			if err := rows.Scan(&k.Provider, &k.ID); err != nil {
				rows.Close()
				return err
			}
			inserted[k] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		_, err = br.Exec()
		return err
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// Each key is inserted by its first op in the batch; the others (and
	// every key stored before) are duplicates.
	for _, op := range ops {
		op.err, op.in.res, op.in.dup = nil, store.InsertResult{}, false
		k := op.in.rec.Key()
		if inserted[k] {
			delete(inserted, k)
			if sub := tracked[k]; op.in.rec.State != store.StateQuarantined && !op.in.rec.ReceivedAt.Before(sub) {
				op.in.res = store.InsertResult{SubmittedAt: sub}
			}
			continue
		}
		op.in.dup = true
	}
	c.sent = true
	_, err = conn.Exec(ctx, "COMMIT")
	return err
}

// pgUpdate is one UpdateDelivery.
type pgUpdate struct {
	key    store.Key
	fn     func(*store.Delivery) error
	result store.Delivery
}

// updateBatch applies a batch of delivery updates (updateAttempt),
// retried once after a transient fault (every fn then runs again, on the
// rows as committed); a connection lost after COMMIT was sent is a commit
// if the database says the transaction committed.
func (p *Postgres) updateBatch(ctx context.Context, ops []*pgOp[*pgUpdate]) error {
	return p.retryTransient(ctx, "delivery update", func(ctx context.Context, c *pgCommit) error {
		return p.updateAttempt(ctx, ops, c)
	})
}

// updateAttempt applies a batch of delivery updates in one transaction of
// two round trips: the transaction's opening (pgDB.queueBegin: its id for
// c) and the rows locked in key order (SELECT ... FOR UPDATE), every fn applied in queue
// order (an update of a key sees the earlier ones of the batch), the
// changed rows written in one statement, COMMIT.
func (p *Postgres) updateAttempt(ctx context.Context, ops []*pgOp[*pgUpdate], c *pgCommit) error {
	for _, op := range ops {
		op.err, op.in.result = nil, store.Delivery{}
	}
	var keys []store.Key
	seen := map[store.Key]bool{}
	for _, op := range ops {
		if k := op.in.key; !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, store.CompareKeys)
	provs, ids := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		provs[i], ids[i] = k.Provider, k.ID
	}
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // a connection left in a transaction is destroyed, not pooled
	read := &pgx.Batch{}
	p.pool.queueBegin(read)
	read.Queue(`SELECT provider, id, `+pgDeliveryCols+` FROM records
		WHERE (provider, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
		ORDER BY provider, id FOR UPDATE`, provs, ids)
	cur := map[store.Key]store.Delivery{}
	br := conn.SendBatch(ctx, read)
	err = func() error {
		if err := p.pool.readBegin(br, c); err != nil {
			return err
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k store.Key
			var d pgDelivery
			if err := rows.Scan(&k.Provider, &k.ID, &d.State, &d.Attempts, &d.Failures, &d.Interrupts, &d.due, &d.owner, &d.until,
				&d.LastStatus, &d.LastError, &d.updated, &d.history, &d.ExpiredReason); err != nil {
				return err
			}
			if cur[k], err = d.delivery(); err != nil {
				return fmt.Errorf("decoding history of %s: %w", k, err)
			}
		}
		return rows.Err()
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	changed := map[store.Key]bool{}
	for _, op := range ops {
		k := op.in.key
		d, ok := cur[k]
		if !ok {
			op.err = store.ErrNotFound
			continue
		}
		op.in.result = d
		next := d
		if err := op.in.fn(&next); err != nil {
			op.err = err
			continue
		}
		next.OwnLease(p.owner)
		op.in.result = next
		cur[k] = next
		changed[k] = true
	}
	write := &pgx.Batch{}
	if len(changed) > 0 {
		var (
			wp, wi, st, le []string
			at, fa, in, ls []int32
			due, until, up []*int64
			ow             []*string
			hi             [][]byte
			er             []string // expired_reason
		)
		for _, k := range keys {
			if !changed[k] {
				continue
			}
			d := cur[k]
			wp, wi, st = append(wp, k.Provider), append(wi, k.ID), append(st, string(d.State))
			at, fa, in = append(at, int32(d.Attempts)), append(fa, int32(d.Failures)), append(in, int32(d.Interrupts))
			due, until, up = append(due, nsPtr(d.DueAt)), append(until, nsPtr(d.Lease.Until)), append(up, nsPtr(d.UpdatedAt))
			var o *string
			if d.Lease.Owner != "" {
				owner := d.Lease.Owner
				o = &owner
			}
			ow, ls, le = append(ow, o), append(ls, int32(d.LastStatus)), append(le, d.LastError)
			hi = append(hi, historyJSON(d.History))
			er = append(er, d.ExpiredReason)
		}
		write.Queue(`UPDATE records r SET state = u.state, attempts = u.attempts, failures = u.failures, interrupts = u.interrupts,
				due_at = u.due_at, lease_owner = u.lease_owner, lease_until = u.lease_until, last_status = u.last_status,
				last_error = u.last_error, updated_at = u.updated_at, history = u.history, expired_reason = u.expired_reason
			FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::int[], $6::int[], $7::bigint[], $8::text[], $9::bigint[],
				$10::int[], $11::text[], $12::bigint[], $13::bytea[], $14::text[])
				AS u(provider, id, state, attempts, failures, interrupts, due_at, lease_owner, lease_until, last_status, last_error, updated_at, history, expired_reason)
			WHERE r.provider = u.provider AND r.id = u.id`,
			wp, wi, st, at, fa, in, due, ow, until, ls, le, up, hi, er)
	}
	write.Queue("COMMIT")
	c.sent = true
	// A failed commit's error is every op's (pgBatcher.commit); a commit
	// that landed despite it (afterFailure) keeps each op's own result.
	return conn.SendBatch(ctx, write).Close()
}

// nsPtr is t in Unix nanoseconds, nil for the zero time.
func nsPtr(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	v := pgNano(t)
	return &v
}
