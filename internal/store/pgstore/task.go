package pgstore

import (
	"context"
	"errors"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
)

// The columns of a task, in the order scanTask reads them.
const pgTaskCols = `provider, id, method, api, submitted_at, pingback_url, server, state, next_poll_at, polls, app_polls, app_polled_at, last_error, updated_at, expires_at, result_at, token, account`

func scanTask(row pgx.Row) (*store.Task, error) {
	var t store.Task
	var sub, next, appPolled, updated, expires, resultAt *int64
	err := row.Scan(&t.Provider, &t.ID, &t.Method, &t.API, &sub, &t.PingbackURL, &t.Server, &t.State, &next,
		&t.Polls, &t.AppPolls, &appPolled, &t.LastError, &updated, &expires, &resultAt, &t.Token, &t.Account)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	t.SubmittedAt, t.NextPollAt, t.UpdatedAt, t.ExpiresAt = fromNS(sub), fromNS(next), fromNS(updated), fromNS(expires)
	t.AppPolledAt, t.ResultAt = fromNS(appPolled), fromNS(resultAt)
	return &t, nil
}

// AddTask implements TaskStore: under the key's advisory lock (shared with
// Insert), the task is stored done if its result is already stored; a
// task already there is read back in the same transaction, on the same
// connection. Two round trips: the statements, then COMMIT.
func (p *Postgres) AddTask(ctx context.Context, t *store.Task) (*store.Task, error) {
	if err := store.CheckAccount(t); err != nil {
		return nil, err
	}
	var existing *store.Task
	err := p.op(func() error {
		existing = nil
		conn, err := p.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release() // a connection left in a transaction is destroyed, not pooled
		b := &pgx.Batch{}
		p.pool.queueBegin(b)
		b.Queue(`SELECT pg_advisory_xact_lock(hashtext($1), hashtext($2))`, t.Provider, t.ID)
		b.Queue(`INSERT INTO tasks (`+pgTaskCols+`)
			SELECT $1, $2, $3, $13, $4, $5, $6,
				CASE WHEN r.id IS NULL THEN $7 ELSE 'done' END,
				CASE WHEN r.id IS NULL THEN $8::bigint END,
				$9, $14, $15::bigint, $10, $11, $12,
				CASE WHEN r.id IS NULL THEN $16::bigint ELSE r.received_at END, $17, $18
			FROM (SELECT 1) one LEFT JOIN records r ON r.provider = $1 AND r.id = $2
				AND r.state <> 'quarantined' AND r.received_at >= coalesce($4::bigint, 0)
			ON CONFLICT (provider, id) DO NOTHING
			RETURNING id`,
			t.Provider, t.ID, t.Method, ns(t.SubmittedAt), t.PingbackURL, t.Server, string(t.State),
			ns(t.NextPollAt), t.Polls, t.LastError, ns(t.UpdatedAt), pgNano(t.ExpiresAt),
			t.API, t.AppPolls, ns(t.AppPolledAt), ns(t.ResultAt), t.Token, t.Account)
		// The task as stored, read in the same transaction (a later
		// statement: it sees the row a conflict found, once committed).
		b.Queue(`SELECT `+pgTaskCols+` FROM tasks WHERE provider = $1 AND id = $2`, t.Provider, t.ID)
		br := conn.SendBatch(ctx, b)
		if err := p.pool.readBegin(br, nil); err != nil {
			br.Close()
			return err
		}
		if _, err := br.Exec(); err != nil {
			br.Close()
			return err
		}
		var id string
		err = br.QueryRow().Scan(&id)
		inserted := err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			br.Close()
			return err
		}
		stored, err := scanTask(br.QueryRow())
		if err != nil {
			br.Close()
			return err
		}
		if err := br.Close(); err != nil {
			return err
		}
		// COMMIT in a round trip of its own: after readBegin's check of
		// synchronous_commit.
		if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
			return err
		}
		if !inserted {
			existing = stored
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return existing, nil
}

// GetTask implements TaskStore. A read that fails on a transient fault
// (a restart, a failover: transientError) is run once more on a new
// connection within ctx's deadline, as a write is (retryTransient): the
// pingback handler judges a pingback by this read.
func (p *Postgres) GetTask(ctx context.Context, key store.Key) (*store.Task, error) {
	var t *store.Task
	err := p.op(func() error {
		return p.retryTransient(ctx, "task read", func(ctx context.Context, _ *pgCommit) error {
			var err error
			t, err = scanTask(p.pool.QueryRow(ctx, `SELECT `+pgTaskCols+` FROM tasks WHERE provider = $1 AND id = $2`, key.Provider, key.ID))
			return err
		})
	})
	return t, err
}

// UpdateTask implements TaskStore: the row is locked while fn runs, so a
// poller's compare-and-set on NextPollAt (its claim of a poll) holds
// across instances.
func (p *Postgres) UpdateTask(ctx context.Context, key store.Key, fn func(*store.Task) error) (*store.Task, error) {
	var result *store.Task
	err := p.readModifyWrite(ctx, `SELECT `+pgTaskCols+` FROM tasks WHERE provider = $1 AND id = $2 FOR UPDATE`,
		[]any{key.Provider, key.ID}, func(row pgx.Row, b *pgx.Batch) error {
			old, cur, err := store.ApplyUpdate(func() (*store.Task, error) { return scanTask(row) }, fn, store.CheckAccount)
			result = old // what a failed update answers
			if err != nil {
				return err
			}
			result = cur
			b.Queue(`UPDATE tasks SET method = $3, submitted_at = $4, pingback_url = $5, server = $6, state = $7,
				next_poll_at = $8, polls = $9, last_error = $10, updated_at = $11, expires_at = $12,
				api = $13, app_polls = $14, app_polled_at = $15, result_at = $16, token = $17, account = $18
				WHERE provider = $1 AND id = $2`,
				key.Provider, key.ID, cur.Method, ns(cur.SubmittedAt), cur.PingbackURL, cur.Server, string(cur.State),
				ns(cur.NextPollAt), cur.Polls, cur.LastError, ns(cur.UpdatedAt), pgNano(cur.ExpiresAt),
				cur.API, cur.AppPolls, ns(cur.AppPolledAt), ns(cur.ResultAt), cur.Token, cur.Account)
			return nil
		})
	return result, err
}

// pgDueTasks is DueTasks' query: for each account asked for (the pairs
// of $1 and $2), at most $4 of its due tasks by next poll time, one range
// of tasks_due_account (0009_accounts.sql) each; then the earliest $4 of
// those. It reads at most $4 rows per account, none of another account.
const pgDueTasks = `SELECT t.* FROM unnest($1::text[], $2::text[]) AS a(provider, account)
	CROSS JOIN LATERAL (SELECT ` + pgTaskCols + ` FROM tasks
		WHERE tasks.provider = a.provider AND tasks.account = a.account AND state = 'pending' AND next_poll_at <= $3
		ORDER BY next_poll_at, id COLLATE "C" LIMIT $4) t
	ORDER BY t.next_poll_at, t.provider COLLATE "C", t.id COLLATE "C" LIMIT $4`

// DueTasks implements TaskStore (pgDueTasks).
func (p *Postgres) DueTasks(ctx context.Context, q store.DueQuery) ([]*store.Task, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	accounts := q.UniqueAccounts()
	if len(accounts) == 0 {
		return nil, p.op(func() error { return nil }) // ErrClosed once closed
	}
	providers, ids := make([]string, len(accounts)), make([]string, len(accounts))
	for i, a := range accounts {
		providers[i], ids[i] = a.Provider, a.ID
	}
	return pgCollect(ctx, p, pgDueTasks, []any{providers, ids, q.Now.UnixNano(), q.Limit}, scanTask)
}
