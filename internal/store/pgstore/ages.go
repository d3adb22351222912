package pgstore

import (
	"context"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Ages implements Counter, database-wide (schema version 4): for each
// provider with counted records or tasks, the oldest backlog result and
// the oldest pending task are one descent each of a partial index
// (records_backlog, tasks_pending_age), and the last live pingback is the
// greatest shard of record_totals.last_callback (schema version 11; in
// last_callbacks before), kept by a trigger in the inserts' own
// transactions. Callers bound how often they ask (the app: at most once a
// second).
func (p *Postgres) Ages(ctx context.Context) (store.Ages, error) {
	out := store.Ages{OldestPendingTask: map[string]time.Time{}, OldestUndelivered: map[string]time.Time{},
		LastCallback: map[string]time.Time{}}
	err := p.op(func() error {
		clear(out.OldestPendingTask)
		clear(out.OldestUndelivered)
		clear(out.LastCallback)
		rows, err := p.pool.Query(ctx, `SELECT v.provider,
				(SELECT min(received_at) FROM records r
					WHERE r.provider = v.provider AND r.state IN ('failed', 'forwarding')),
				(SELECT min(submitted_at) FROM tasks t
					WHERE t.provider = v.provider AND t.state = 'pending'),
				(SELECT max(last_callback) FROM record_totals l WHERE l.provider = v.provider)
			FROM (SELECT provider FROM record_totals UNION SELECT provider FROM task_counts) v`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var prov string
			var back, pend, last *int64
			if err := rows.Scan(&prov, &back, &pend, &last); err != nil {
				return err
			}
			for _, x := range []struct {
				v *int64
				m map[string]time.Time
			}{{back, out.OldestUndelivered}, {pend, out.OldestPendingTask}, {last, out.LastCallback}} {
				if x.v != nil {
					x.m[prov] = fromNS(x.v)
				}
			}
		}
		return rows.Err()
	})
	return out, err
}
