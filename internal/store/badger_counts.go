package store

import (
	"context"
	"strings"
)

// Counts implements Counter. Badger keeps the counts in memory: rebuilt
// from the keys when the store opens (countKeys), then moved by every
// committed batch by the state changes its operations wrote. A delivered
// record whose retention ends leaves Badger by its TTL, without a
// transaction: it stays counted as delivered until the store is opened
// again (the counts of every other state are exact, since a record left
// undelivered is forgotten by Expire, which counts it out).
func (b *Badger) Counts(ctx context.Context) (Counts, error) {
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return Counts{}, ErrClosed
	}
	return b.counts.snapshot(), nil
}

// countKeys counts what the store holds from its keys alone (no value is
// read): records by r/, their states by the state index v/ (queued,
// failed, rejected, parked) and the lease index l/ (forwarding), the rest
// delivered; pending tasks, by provider and account, by the pending runs
// of the task order o/.
func countKeys(w *batch) (*memCounts, error) {
	c := newMemCounts()
	total := map[string]int64{}
	var ds []countDelta
	add := func(provider string, state State) {
		ds = append(ds, countDelta{provider: provider, state: state, n: 1})
		total[provider]--
	}
	steps := []struct {
		prefix string
		fn     func(k []byte)
	}{
		{recordPrefix, func(k []byte) {
			if key, ok := parseTail(k[len(recordPrefix):]); ok {
				total[key.Provider]++
			}
		}},
		{statePrefix, func(k []byte) {
			state, tail, ok := strings.Cut(string(k[len(statePrefix):]), "/")
			if key, ok2 := parseTail([]byte(tail)); ok && ok2 {
				add(key.Provider, State(state))
			}
		}},
		{leasePrefix, func(k []byte) {
			if _, _, key, ok := parseLeaseKey(k); ok {
				add(key.Provider, StateForwarding)
			}
		}},
		{pendingOrderPrefix, func(k []byte) {
			if provider, account, _, _, ok := splitAccountTimeKey(k[len(pendingOrderPrefix):]); ok {
				ds = append(ds, countDelta{provider: provider, account: account, task: true, n: 1})
			}
		}},
	}
	for _, s := range steps {
		if err := w.scan(s.prefix, func(k []byte) bool { s.fn(k); return true }); err != nil {
			return nil, err
		}
	}
	for p, n := range total {
		if n > 0 {
			ds = append(ds, countDelta{provider: p, state: StateDelivered, n: n})
		}
	}
	c.apply(ds)
	return c, nil
}
