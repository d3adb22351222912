package store

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// ErrPurged means the record under the key was purged (see Purger): it is
// gone, and a key-only tombstone remains until the record's retention
// ends, so that the result is never stored again. errors.Is(ErrPurged,
// ErrNotFound) holds.
var ErrPurged = fmt.Errorf("%w: purged", ErrNotFound)

// Position is a place in the order of ListPage: received time, then
// provider, then id (the strings compared bytewise).
type Position struct {
	ReceivedAt time.Time
	Key        Key
}

// ComparePosition orders positions as ListPage does.
func ComparePosition(a, b Position) int {
	return cmp.Or(cmp.Compare(UnixNano(a.ReceivedAt), UnixNano(b.ReceivedAt)),
		strings.Compare(a.Key.Provider, b.Key.Provider), strings.Compare(a.Key.ID, b.Key.ID))
}

// PositionOf is the position of r.
func PositionOf(r *Record) Position { return Position{ReceivedAt: r.ReceivedAt, Key: r.Key()} }

// ListQuery selects one page of ListPage. Empty fields match everything.
type ListQuery struct {
	Provider string
	State    State
	// ReceivedAfter keeps records received at or after it, ReceivedBefore
	// those received before it (zero: no bound).
	ReceivedAfter, ReceivedBefore time.Time
	// After, if set, starts the page after this position: the Next of
	// the page before.
	After *Position
	// Limit is the most records on the page (at least 1).
	Limit int
}

// Page is one page of ListPage.
type Page struct {
	// Records are ordered by received time, then key.
	Records []*Record
	// Next is the position to ask the next page from (ListQuery.After),
	// nil when this page is the last.
	Next *Position
}

// Lister is the part of the Store contract that lists records for
// operators by pages, cheaply however many are stored: a page costs what
// it holds (and, with a state filter, the records of other states it
// steps over in the time order), never a scan of every record.
type Lister interface {
	// ListPage returns the first q.Limit records matching q after
	// q.After, in received-time order.
	ListPage(ctx context.Context, q ListQuery) (Page, error)
}

// TaskPosition is a place in the order of ListTaskPage: submission time
// (Task.SubmittedAt, submitted_at), then provider, then id (the strings
// compared bytewise).
type TaskPosition struct {
	SubmittedAt time.Time
	Key         Key
}

// CompareTaskPosition orders task positions as ListTaskPage does.
func CompareTaskPosition(a, b TaskPosition) int {
	return cmp.Or(cmp.Compare(UnixNano(a.SubmittedAt), UnixNano(b.SubmittedAt)),
		strings.Compare(a.Key.Provider, b.Key.Provider), strings.Compare(a.Key.ID, b.Key.ID))
}

// TaskPositionOf is the position of t.
func TaskPositionOf(t *Task) TaskPosition {
	return TaskPosition{SubmittedAt: t.SubmittedAt, Key: t.Key()}
}

// TaskQuery selects one page of ListTaskPage. Empty fields match
// everything.
type TaskQuery struct {
	Provider string
	State    TaskState
	// Account keeps the tasks of this account id (Task.Account), alone
	// or with Provider and State; empty matches every account (there is
	// no filter for tasks without one).
	Account string
	// After, if set, starts the page after this position (the Next of
	// the page before).
	After *TaskPosition
	// Limit is the most tasks on the page (at least 1).
	Limit int
}

// TaskPage is one page of ListTaskPage.
type TaskPage struct {
	// Tasks are ordered by submission time, then provider, then id.
	Tasks []*Task
	// Next is the position to ask the next page from, nil on the last
	// page.
	Next *TaskPosition
}

// PurgeQuery selects what Purge erases: Keys, or every record matching
// the filter fields (at least one of them set).
type PurgeQuery struct {
	Keys                          []Key
	Provider                      string
	State                         State
	ReceivedAfter, ReceivedBefore time.Time
}

// Filtered reports whether q has a filter field set.
func (q PurgeQuery) Filtered() bool {
	return q.Provider != "" || q.State != "" || !q.ReceivedAfter.IsZero() || !q.ReceivedBefore.IsZero()
}

// Purger is the part of the Store contract that erases results (the right
// to erasure). A purged record is deleted with its task and every index
// entry, in one transaction per batch of keys, whatever its state: a
// forward in flight ends and finds nothing to record (UpdateDelivery:
// ErrNotFound; Renew: ErrLeaseLost), so nothing resurrects it. A key-only
// tombstone stays until the record's retention ends: Insert of the same
// key is then a duplicate (Existing is set, Purged too, nothing written)
// and Get answers ErrPurged.
type Purger interface {
	// Purge erases the records q selects and returns how many it erased.
	// Keys with no stored record are skipped (not counted).
	Purge(ctx context.Context, q PurgeQuery) (int, error)
}

// PageFrom keeps a page of limit out of recs, which hold up to limit+1
// records in order: Next is set when there was one more.
func PageFrom(recs []*Record, limit int) Page {
	if len(recs) <= limit {
		return Page{Records: recs}
	}
	recs = recs[:limit]
	next := PositionOf(recs[limit-1])
	return Page{Records: recs, Next: &next}
}

// TaskPageFrom keeps a page of limit out of up to limit+1 tasks in order.
func TaskPageFrom(ts []*Task, limit int) TaskPage {
	if len(ts) <= limit {
		return TaskPage{Tasks: ts}
	}
	ts = ts[:limit]
	next := TaskPositionOf(ts[limit-1])
	return TaskPage{Tasks: ts, Next: &next}
}

// CheckLimit refuses a page query without a positive limit.
func CheckLimit(n int) error {
	if n < 1 {
		return fmt.Errorf("list: limit %d, need at least 1", n)
	}
	return nil
}

// UnixNano is t in Unix nanoseconds, 0 for the zero time or any time
// before 1970, the largest int64 for any time after 2262 (where UnixNano
// would wrap).
func UnixNano(t time.Time) uint64 {
	if t.IsZero() || t.Before(time.Unix(0, 0)) {
		return 0
	}
	if t.After(time.Unix(0, math.MaxInt64)) {
		return math.MaxInt64
	}
	return uint64(t.UnixNano())
}
