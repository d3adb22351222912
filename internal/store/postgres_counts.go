package store

import (
	"context"
)

// Counts implements Counter: the sums of the counter tables that the
// schema's triggers keep in the same transactions as the rows (schema
// version 3; tasks by account since version 9), database-wide.
func (p *Postgres) Counts(ctx context.Context) (Counts, error) {
	out := Counts{Records: map[string]map[State]int64{}, TasksPending: map[string]int64{}, TasksPendingByAccount: map[string]map[string]int64{}}
	err := p.op(func() error {
		clear(out.Records)
		clear(out.TasksPending)
		clear(out.TasksPendingByAccount)
		rows, err := p.pool.Query(ctx, `SELECT provider, state, sum(n)::bigint FROM record_counts
			GROUP BY provider, state HAVING sum(n) > 0`)
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
				out.Records[prov] = map[State]int64{}
			}
			out.Records[prov][State(state)] = n
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
			addCount(out.TasksPendingByAccount, prov, acct, n)
		}
		return rows.Err()
	})
	return out, err
}
