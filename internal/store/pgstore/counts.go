package pgstore

import (
	"context"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Counts implements Counter, database-wide, in one statement (one
// snapshot): the sums of the counter tables that the schema's triggers
// keep in the same transactions as the rows (schema version 3; tasks by
// account since version 9; since version 11 the records of each provider
// in record_totals, and record_counts only for the states a record stays
// in). Records in StateForwarding are counted where they are, an index
// range of the records in flight (records_forwarding), and
// StateDelivered is a provider's total less its other states, so that a
// forward that succeeds writes no count row.
func (p *Postgres) Counts(ctx context.Context) (store.Counts, error) {
	out := store.Counts{Records: map[string]map[store.State]int64{}, TasksPending: map[string]int64{}, TasksPendingByAccount: map[string]map[string]int64{}}
	err := p.op(func() error {
		clear(out.Records)
		clear(out.TasksPending)
		clear(out.TasksPendingByAccount)
		rows, err := p.pool.Query(ctx, `WITH
				c AS (SELECT provider, state, sum(n)::bigint AS n FROM record_counts
					WHERE state NOT IN ('forwarding', 'delivered') GROUP BY provider, state),
				f AS (SELECT provider, count(*) AS n FROM records WHERE state = 'forwarding' GROUP BY provider),
				t AS (SELECT provider, sum(n)::bigint AS n FROM record_totals GROUP BY provider)
			SELECT provider, state, n FROM (
				SELECT provider, state, n FROM c
				UNION ALL SELECT provider, 'forwarding', n FROM f
				UNION ALL SELECT t.provider, 'delivered', t.n - coalesce(f.n, 0)
					- coalesce((SELECT sum(c.n) FROM c WHERE c.provider = t.provider), 0)
					FROM t LEFT JOIN f ON f.provider = t.provider) v
			WHERE n > 0`)
		if err != nil {
			return err
		}
		for rows.Next() {
			var prov, state string
			var n int64
			if err := rows.Scan(&prov, &state, &n); err != nil {
				rows.Close()
				return err
			}
			if out.Records[prov] == nil {
				out.Records[prov] = map[store.State]int64{}
			}
			out.Records[prov][store.State(state)] = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		rows, err = p.pool.Query(ctx, `SELECT provider, account, sum(n)::bigint FROM task_counts
			WHERE state = 'pending' GROUP BY provider, account HAVING sum(n) > 0`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var prov, acct string
			var n int64
			if err := rows.Scan(&prov, &acct, &n); err != nil {
				return err
			}
			out.TasksPending[prov] += n
			store.AddCount(out.TasksPendingByAccount, prov, acct, n)
		}
		return rows.Err()
	})
	return out, err
}
