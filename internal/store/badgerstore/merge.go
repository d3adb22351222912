package badgerstore

import (
	"context"

	"github.com/dgraph-io/badger/v4"
)

// runStart is one run of an index merged by mergeRuns: the keys under
// prefix, from seek on.
type runStart struct{ prefix, seek []byte }

// mergeRuns walks the runs of starts as one, in cmp order of the
// positions parse reads from their keys (keys it cannot parse are
// skipped), calling visit on each position until visit answers false or
// an error, the runs end, or ctx is done. Each run must be in cmp order
// itself; a step costs one key read (no value).
func mergeRuns[P any](ctx context.Context, txn *badger.Txn, starts []runStart, parse func([]byte) (P, bool),
	cmp func(a, b P) int, visit func(P) (bool, error)) error {
	type run struct {
		it  *badger.Iterator
		pos P
		ok  bool
	}
	runs := make([]*run, 0, len(starts))
	defer func() {
		for _, r := range runs {
			r.it.Close()
		}
	}()
	next := func(r *run) {
		for ; r.it.Valid(); r.it.Next() {
			if r.pos, r.ok = parse(r.it.Item().Key()); r.ok {
				return
			}
		}
		r.ok = false
	}
	for _, s := range starts {
		r := &run{it: txn.NewIterator(badger.IteratorOptions{Prefix: s.prefix})}
		runs = append(runs, r)
		r.it.Seek(s.seek)
		next(r)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		var best *run
		for _, r := range runs {
			if r.ok && (best == nil || cmp(r.pos, best.pos) < 0) {
				best = r
			}
		}
		if best == nil {
			return nil
		}
		pos := best.pos
		best.it.Next()
		next(best)
		if more, err := visit(pos); err != nil || !more {
			return err
		}
	}
}
