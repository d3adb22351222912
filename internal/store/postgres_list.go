package store

import (
	"context"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ListPage implements Lister: one query over the received-time index
// (records_state_received when a state is given, records_received
// otherwise), with only the conditions q sets, so the planner reads the
// page from the index; one row more than the page tells whether another
// follows.
func (p *Postgres) ListPage(ctx context.Context, q ListQuery) (Page, error) {
	if err := checkLimit(q.Limit); err != nil {
		return Page{}, err
	}
	where, args := pgListWhere(q)
	args = append(args, q.Limit+1)
	sql := `SELECT ` + pgRecordCols + ` FROM records` + where +
		` ORDER BY received_at, provider COLLATE "C", id COLLATE "C" LIMIT $` + strconv.Itoa(len(args))
	var out []*Record
	err := p.op(func() error {
		out = nil
		rows, err := p.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Record, error) { return scanRecord(row) })
		return err
	})
	if err != nil {
		return Page{}, err
	}
	return pageFrom(out, q.Limit), nil
}

// pgListWhere is the WHERE clause of q and its arguments.
func pgListWhere(q ListQuery) (string, []any) {
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if q.State != "" {
		conds = append(conds, "state = "+arg(string(q.State)))
	}
	if q.Provider != "" {
		conds = append(conds, "provider = "+arg(q.Provider))
	}
	if !q.ReceivedAfter.IsZero() {
		conds = append(conds, "received_at >= "+arg(int64(unixNano(q.ReceivedAfter))))
	}
	if !q.ReceivedBefore.IsZero() {
		conds = append(conds, "received_at < "+arg(int64(unixNano(q.ReceivedBefore))))
	}
	if q.After != nil {
		conds = append(conds, `(received_at, provider COLLATE "C", id COLLATE "C") > (`+
			arg(int64(unixNano(q.After.ReceivedAt)))+", "+arg(q.After.Key.Provider)+", "+arg(q.After.Key.ID)+")")
	}
	if len(conds) == 0 {
		return "", args
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// ListTaskPage implements TaskStore: one query over the submission-time
// index (tasks_state_submitted when a state is given, tasks_submitted
// otherwise; migration 0007), with only the conditions q sets and a row
// comparison for the cursor (keyset pagination); one row more than the
// page tells whether another follows.
func (p *Postgres) ListTaskPage(ctx context.Context, q TaskQuery) (TaskPage, error) {
	if err := checkLimit(q.Limit); err != nil {
		return TaskPage{}, err
	}
	var conds []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if q.State != "" {
		conds = append(conds, "state = "+arg(string(q.State)))
	}
	if q.Provider != "" {
		conds = append(conds, "provider = "+arg(q.Provider))
	}
	if q.After != nil {
		conds = append(conds, `(coalesce(submitted_at, 0), provider COLLATE "C", id COLLATE "C") > (`+
			arg(int64(unixNano(q.After.SubmittedAt)))+", "+arg(q.After.Key.Provider)+", "+arg(q.After.Key.ID)+")")
	}
	where := ""
	if len(conds) > 0 {
		where = " WHERE " + strings.Join(conds, " AND ")
	}
	sql := `SELECT ` + pgTaskCols + ` FROM tasks` + where +
		` ORDER BY coalesce(submitted_at, 0), provider COLLATE "C", id COLLATE "C" LIMIT ` + arg(q.Limit+1)
	var out []*Task
	err := p.op(func() error {
		out = nil
		rows, err := p.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*Task, error) { return scanTask(row) })
		return err
	})
	if err != nil {
		return TaskPage{}, err
	}
	return taskPageFrom(out, q.Limit), nil
}
