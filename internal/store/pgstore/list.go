package pgstore

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/jackc/pgx/v5"
)

// ListPage implements Lister: one query over the received-time index
// (records_state_received when a state is given, records_received
// otherwise), with only the conditions q sets, so the planner reads the
// page from the index; one row more than the page tells whether another
// follows.
func (p *Postgres) ListPage(ctx context.Context, q store.ListQuery) (store.Page, error) {
	if err := store.CheckLimit(q.Limit); err != nil {
		return store.Page{}, err
	}
	where, args := pgListWhere(q)
	args = append(args, q.Limit+1)
	sql := `SELECT ` + pgRecordCols + ` FROM records` + where +
		` ORDER BY received_at, provider COLLATE "C", id COLLATE "C" LIMIT $` + strconv.Itoa(len(args))
	out, err := pgCollect(ctx, p, sql, args, scanRecord)
	if err != nil {
		return store.Page{}, err
	}
	return store.PageFrom(out, q.Limit), nil
}

// pgListWhere is the WHERE clause of q and its arguments.
func pgListWhere(q store.ListQuery) (string, []any) {
	var w pgWhere
	if q.State != "" {
		w.and("state = " + w.arg(string(q.State)))
	}
	if q.Provider != "" {
		w.and("provider = " + w.arg(q.Provider))
	}
	if !q.ReceivedAfter.IsZero() {
		w.and("received_at >= " + w.arg(int64(store.UnixNano(q.ReceivedAfter))))
	}
	if !q.ReceivedBefore.IsZero() {
		w.and("received_at < " + w.arg(int64(store.UnixNano(q.ReceivedBefore))))
	}
	if q.After != nil {
		w.after(`received_at`, q.After.ReceivedAt, q.After.Key)
	}
	return w.String(), w.args
}

// pgWhere builds a WHERE clause of conditions joined by AND, and its
// arguments.
type pgWhere struct {
	conds []string
	args  []any
}

// arg adds v to the arguments and returns its placeholder.
func (w *pgWhere) arg(v any) string {
	w.args = append(w.args, v)
	return "$" + strconv.Itoa(len(w.args))
}

func (w *pgWhere) and(cond string) { w.conds = append(w.conds, cond) }

// after keeps the rows after (at, k) in the order of timeCol, then
// provider and id bytewise: a row comparison the indexes serve.
func (w *pgWhere) after(timeCol string, at time.Time, k store.Key) {
	w.and(`(` + timeCol + `, provider COLLATE "C", id COLLATE "C") > (` +
		w.arg(int64(store.UnixNano(at))) + ", " + w.arg(k.Provider) + ", " + w.arg(k.ID) + ")")
}

// String is the clause, " WHERE ...", or "" without conditions.
func (w *pgWhere) String() string {
	if len(w.conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(w.conds, " AND ")
}

// pgTaskTime is the task order's time: the submission time, NULL as 0
// (the expression migration 0007 indexes).
const pgTaskTime = `coalesce(submitted_at, 0)`

// ListTaskPage implements TaskStore: one query over the submission-time
// index (with an account, tasks_account_state_submitted when a state is
// given, tasks_account_submitted otherwise, migration 0009; without,
// tasks_state_submitted or tasks_submitted, migration 0007), with only the conditions q sets and a row
// comparison for the cursor (keyset pagination); one row more than the
// page tells whether another follows.
func (p *Postgres) ListTaskPage(ctx context.Context, q store.TaskQuery) (store.TaskPage, error) {
	if err := store.CheckLimit(q.Limit); err != nil {
		return store.TaskPage{}, err
	}
	sql, args := pgTaskPageQuery(q)
	out, err := pgCollect(ctx, p, sql, args, scanTask)
	if err != nil {
		return store.TaskPage{}, err
	}
	return store.TaskPageFrom(out, q.Limit), nil
}

// pgTaskPageQuery is ListTaskPage's query for q and its arguments.
func pgTaskPageQuery(q store.TaskQuery) (string, []any) {
	var w pgWhere
	if q.State != "" {
		w.and("state = " + w.arg(string(q.State)))
	}
	if q.Provider != "" {
		w.and("provider = " + w.arg(q.Provider))
	}
	if q.Account != "" {
		w.and("account = " + w.arg(q.Account))
	}
	if q.After != nil {
		w.after(pgTaskTime, q.After.SubmittedAt, q.After.Key)
	}
	sql := `SELECT ` + pgTaskCols + ` FROM tasks` + w.String() +
		` ORDER BY ` + pgTaskTime + `, provider COLLATE "C", id COLLATE "C" LIMIT ` + w.arg(q.Limit+1)
	return sql, w.args
}

// pgCollect runs sql (through p.op) and scans every row with scan.
func pgCollect[T any](ctx context.Context, p *Postgres, sql string, args []any, scan func(pgx.Row) (*T, error)) ([]*T, error) {
	var out []*T
	err := p.op(func() error {
		out = nil
		rows, err := p.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (*T, error) { return scan(row) })
		return err
	})
	return out, err
}
