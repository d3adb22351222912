package pgstore

import (
	"context"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
)

// latencyKeep is how many delays per provider the latencies table keeps
// (at least; older ones are trimmed every latencyTrimEvery inserts).
const (
	latencyKeep      = 1024
	latencyTrimEvery = 64
)

// TakePoll implements SharedPolling: one transaction that locks the
// account's row (providers, keyed by provider and account since schema
// 9), so instances take requests one after another. The rate
// limit is a GCRA on next_slot (the theoretical arrival time of the next
// request), by the database's clock.
func (p *Postgres) TakePoll(ctx context.Context, acct store.Account, l store.PollLimit) (store.PollGrant, error) {
	var g store.PollGrant
	step := int64(float64(time.Second) / l.Rate)
	slack := int64(max(l.Burst, 1)-1) * step
	clock := p.clockArg()
	err := p.tx(ctx, func(tx pgx.Tx) error {
		g = store.PollGrant{}
		if _, err := tx.Exec(ctx, `INSERT INTO providers (provider, account) VALUES ($1, $2) ON CONFLICT DO NOTHING`, acct.Provider, acct.ID); err != nil {
			return err
		}
		var tat, now int64
		if err := tx.QueryRow(ctx, `SELECT polls, tracked, next_slot, coalesce($3::bigint, now_ns()) FROM providers
			WHERE provider = $1 AND account = $2 FOR UPDATE`,
			acct.Provider, acct.ID, clock).Scan(&g.Polls, &g.Tracked, &tat, &now); err != nil {
			return err
		}
		tat = max(tat, now)
		switch {
		case g.Polls >= int64(l.PerTask)*g.Tracked+int64(l.Allowance):
			g.OverBudget = true
			return nil
		case tat-now > slack:
			g.Wait = time.Duration(tat - now - slack)
			return nil
		}
		g.OK = true
		g.Polls++
		_, err := tx.Exec(ctx, `UPDATE providers SET polls = polls + 1, next_slot = $3 WHERE provider = $1 AND account = $2`,
			acct.Provider, acct.ID, tat+step)
		return err
	})
	return g, err
}

// PollBudgets implements SharedPolling.
func (p *Postgres) PollBudgets(ctx context.Context) (map[store.Account]store.PollBudget, error) {
	out := map[store.Account]store.PollBudget{}
	err := p.op(func() error {
		clear(out)
		rows, err := p.pool.Query(ctx, `SELECT provider, account, polls, tracked FROM providers`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var a store.Account
			var b store.PollBudget
			if err := rows.Scan(&a.Provider, &a.ID, &b.Polls, &b.Tracked); err != nil {
				return err
			}
			out[a] = b
		}
		return rows.Err()
	})
	return out, err
}

// CountTracked implements SharedPolling.
func (p *Postgres) CountTracked(ctx context.Context, acct store.Account) error {
	return p.op(func() error {
		_, err := p.exec(ctx, `INSERT INTO providers (provider, account, tracked) VALUES ($1, $2, 1)
			ON CONFLICT (provider, account) DO UPDATE SET tracked = providers.tracked + 1`, acct.Provider, acct.ID)
		return err
	})
}

// ObserveDelay implements SharedPolling; every latencyTrimEvery inserts
// it trims the provider's delays to the latest latencyKeep.
func (p *Postgres) ObserveDelay(ctx context.Context, provider string, d time.Duration) error {
	return p.op(func() error {
		var seq int64
		err := p.runTx(ctx, nil, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `INSERT INTO latencies (provider, delay_ns) VALUES ($1, $2) RETURNING seq`, provider, int64(d)).Scan(&seq)
		})
		if err != nil {
			return err
		}
		if seq%latencyTrimEvery != 0 {
			return nil
		}
		_, err = p.exec(ctx, `DELETE FROM latencies WHERE provider = $1 AND seq < (
				SELECT min(seq) FROM (SELECT seq FROM latencies WHERE provider = $1 ORDER BY seq DESC LIMIT $2) recent)`,
			provider, latencyKeep)
		return err
	})
}

// RecentDelays implements SharedPolling.
func (p *Postgres) RecentDelays(ctx context.Context, provider string, n int) ([]time.Duration, error) {
	var out []time.Duration
	err := p.op(func() error {
		rows, err := p.pool.Query(ctx, `SELECT delay_ns FROM latencies WHERE provider = $1 ORDER BY seq DESC LIMIT $2`, provider, n)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var d int64
			if err := rows.Scan(&d); err != nil {
				return err
			}
			out = append(out, time.Duration(d))
		}
		return rows.Err()
	})
	return out, err
}

var _ store.SharedPolling = (*Postgres)(nil)
