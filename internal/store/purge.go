package store

import (
	"context"
	"errors"
)

// purgeChunk is how many keys one purge transaction takes.
const purgeChunk = 256

// PurgeBy runs a Purge of q on a store, one transaction per chunk of keys
// (purgeKeys; state, if set, is checked again in the transaction, since a
// record listed may have moved on): q.Keys, or the records ListPage finds
// for q's filter.
func PurgeBy(ctx context.Context, l Lister, q PurgeQuery, purgeKeys func(keys []Key, state State) (int, error)) (int, error) {
	if len(q.Keys) == 0 && !q.Filtered() {
		return 0, errors.New("purge: no keys and no filter")
	}
	n := 0
	if len(q.Keys) > 0 {
		for start := 0; start < len(q.Keys); start += purgeChunk {
			m, err := purgeKeys(q.Keys[start:min(start+purgeChunk, len(q.Keys))], "")
			n += m
			if err != nil {
				return n, err
			}
		}
		return n, nil
	}
	lq := ListQuery{Provider: q.Provider, State: q.State, ReceivedAfter: q.ReceivedAfter, ReceivedBefore: q.ReceivedBefore, Limit: purgeChunk}
	for {
		page, err := l.ListPage(ctx, lq)
		if err != nil {
			return n, err
		}
		keys := make([]Key, len(page.Records))
		for i, r := range page.Records {
			keys[i] = r.Key()
		}
		m, err := purgeKeys(keys, q.State)
		n += m
		if err != nil || page.Next == nil {
			return n, err
		}
		lq.After = page.Next
	}
}
