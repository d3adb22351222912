package pgstore

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Pauses on PostgreSQL (schema version 12): one row of pauses per paused
// provider, shared by every instance of the database. Each call is one
// transaction (a write, or a lone read), so it runs unchanged behind a
// transaction pooler.

const pgPauseCols = `provider, reason, since, until, paused_by`

// PutPause implements store.Pauser: an upsert that keeps since and
// paused_by of a pause already there.
func (p *Postgres) PutPause(ctx context.Context, x store.Pause) (store.Pause, error) {
	var out store.Pause
	err := p.tx(ctx, func(tx pgx.Tx) error {
		row := tx.QueryRow(ctx, `INSERT INTO pauses (`+pgPauseCols+`) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (provider) DO UPDATE SET reason = excluded.reason, until = excluded.until
			RETURNING `+pgPauseCols, x.Provider, x.Reason, ns(x.Since), ns(x.Until), x.By)
		var err error
		out, err = scanPause(row)
		return err
	})
	return out, err
}

// DeletePause implements store.Pauser.
func (p *Postgres) DeletePause(ctx context.Context, provider string, dueBy time.Time) (store.Pause, error) {
	var out store.Pause
	err := p.tx(ctx, func(tx pgx.Tx) error {
		row := tx.QueryRow(ctx, `DELETE FROM pauses WHERE provider = $1
			AND ($2::bigint IS NULL OR (until IS NOT NULL AND until <= $2::bigint))
			RETURNING `+pgPauseCols, provider, ns(dueBy))
		var err error
		out, err = scanPause(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		return err
	})
	return out, err
}

// ListPauses implements store.Pauser.
func (p *Postgres) ListPauses(ctx context.Context) ([]store.Pause, error) {
	var out []store.Pause
	err := p.op(func() error {
		out = nil
		rows, err := p.pool.Query(ctx, `SELECT `+pgPauseCols+` FROM pauses ORDER BY provider`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			x, err := scanPause(rows)
			if err != nil {
				return err
			}
			out = append(out, x)
		}
		return rows.Err()
	})
	return out, err
}

// scanPause reads one row of pgPauseCols.
func scanPause(row pgx.Row) (store.Pause, error) {
	var x store.Pause
	var since, until *int64
	if err := row.Scan(&x.Provider, &x.Reason, &since, &until, &x.By); err != nil {
		return store.Pause{}, err
	}
	x.Since, x.Until = fromNS(since), fromNS(until)
	return x, nil
}

// Interface guards
var _ store.Pauser = (*Postgres)(nil)
