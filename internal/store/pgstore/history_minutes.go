package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/store"
)

// WriteMinute implements store.HistoryStore (schema version 13): one
// transaction upserting the row of (minute, instance) in history_minutes.
func (p *Postgres) WriteMinute(ctx context.Context, m store.HistoryMinute) error {
	figures, err := json.Marshal(m)
	if err != nil {
		return err
	}
	minute := m.Minute.UTC().Truncate(time.Minute).Unix()
	return p.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO history_minutes (minute, instance, figures) VALUES ($1, $2, $3)
			ON CONFLICT (minute, instance) DO UPDATE SET figures = excluded.figures`, minute, m.Instance, string(figures))
		return err
	})
}

// Minutes implements store.HistoryStore: one range scan of
// history_minutes' primary key.
func (p *Postgres) Minutes(ctx context.Context, from, to time.Time) ([]store.HistoryMinute, error) {
	var out []store.HistoryMinute
	lo, hi := ceilMinute(from), ceilMinute(to)
	err := p.op(func() error {
		out = out[:0]
		rows, err := p.pool.Query(ctx, `SELECT minute, instance, figures::text FROM history_minutes
			WHERE minute >= $1 AND minute < $2 ORDER BY minute, instance`, lo, hi)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var minute int64
			var inst, figures string
			if err := rows.Scan(&minute, &inst, &figures); err != nil {
				return err
			}
			m := store.HistoryMinute{Minute: time.Unix(minute, 0).UTC(), Instance: inst}
			if err := json.Unmarshal([]byte(figures), &m); err != nil {
				return fmt.Errorf("history minute %d of %s: %w", minute, inst, err)
			}
			out = append(out, m)
		}
		return rows.Err()
	})
	return out, err
}

// PruneMinutes implements store.HistoryStore: one DELETE of a range of
// the primary key.
func (p *Postgres) PruneMinutes(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := p.tx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM history_minutes WHERE minute < $1`, ceilMinute(before))
		n = tag.RowsAffected()
		return err
	})
	return int(n), err
}

// ceilMinute is the Unix second of the first whole minute at or after t.
func ceilMinute(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return (s + 59) / 60 * 60
}

// Interface guards
var _ store.HistoryStore = (*Postgres)(nil)
