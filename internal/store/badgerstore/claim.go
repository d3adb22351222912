package badgerstore

import (
	"errors"
	"math"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// pick is a record a claim takes: shown to Decide, then written back.
type pick struct {
	key   store.Key
	rec   *store.Record  // as first stored, its Delivery the current one
	old   store.Delivery // the current delivery state
	exp   uint64         // the record's expiry, Unix seconds
	lapse string         // why its lease lapsed, "" for a due record
}

// claimScan is one claim's candidates being gathered: the records taken
// so far, in order, and the room left to each limited route.
type claimScan struct {
	b     *Badger
	w     *batch
	req   *store.ClaimRequest
	room  map[string]int // nil: no route is limited
	taken map[store.Key]bool
	skip  map[string]bool // ClaimRequest.SkipProviders
	out   []pick
}

// claimPass is one pass of a claim (lapsed leases, fair, by due time):
// it takes at most need records and examines at most budget candidates.
type claimPass struct {
	need, budget, examined, took int
}

func newClaimPass(need int) *claimPass {
	return &claimPass{need: need, budget: need + store.ClaimSkipBudget}
}

// done reports whether the pass took what it needs or spent its budget.
func (p *claimPass) done() bool { return p.took >= p.need || p.examined >= p.budget }

// claimable gathers the records of a claim, their delivery states read and
// checked (an index entry may be stale): req.Keys, or the passes of
// ClaimRequest in order. Lapsed leases are those of earlier epochs, then
// this epoch's expired ones (l/); fair claims walk f/, the due records with
// at most FewFailures failures; the rest walks q/. A pass stops once it
// took what it needs or examined need+ClaimSkipBudget candidates (a
// record found stale or of a route without room counts as examined; one
// an earlier pass took does not).
func (b *Badger) claimable(w *batch, req store.ClaimRequest) ([]pick, error) {
	s := &claimScan{b: b, w: w, req: &req, taken: map[store.Key]bool{}}
	if len(req.Keys) > 0 {
		// Each record once, however often it is named: a claim that
		// returned a record twice would forward it twice.
		for _, k := range req.Keys {
			if len(s.taken) == req.Limit {
				break
			}
			if s.taken[k] {
				continue
			}
			s.taken[k] = true
			if _, err := s.try(k, nil); err != nil {
				return nil, err
			}
		}
		return s.out, nil
	}
	for _, p := range req.SkipProviders {
		if s.skip == nil {
			s.skip = map[string]bool{}
		}
		s.skip[p] = true
	}
	if req.Route != nil && len(req.Room) > 0 {
		s.room = make(map[string]int, len(req.Room))
		for r, n := range req.Room {
			s.room[r] = n
		}
	}
	if err := s.lapsed(newClaimPass(req.Limit)); err != nil {
		return nil, err
	}
	if left := req.Limit - len(s.out); req.Reserved > 0 && left > 0 {
		fair := func(d *store.Delivery) bool { return d.Failures <= store.FewFailures }
		if err := s.due(fairPrefix, newClaimPass(min(req.Reserved, left)), fair); err != nil {
			return nil, err
		}
	}
	if left := req.Limit - len(s.out); left > 0 {
		if err := s.due(duePrefix, newClaimPass(left), nil); err != nil {
			return nil, err
		}
	}
	return s.out, nil
}

// lapsed is the pass of lapsed leases: l/<epoch><until><provider>/<id>;
// earlier epochs sort first, all lapsed. This epoch's are scanned from the
// earliest lease this handle holds (b.leases): entries before it are of
// leases that ended.
func (s *claimScan) lapsed(p *claimPass) error {
	b := s.b
	if b.leases.older {
		older := false
		err := s.walk(leasePrefix, nil, p, func(k []byte) (store.Key, bool, bool) {
			epoch, _, key, ok := parseLeaseKey(k)
			if ok && epoch >= b.epoch {
				return store.Key{}, false, false
			}
			older = older || ok
			return key, ok, true
		}, nil)
		if err != nil || p.done() {
			return err
		}
		if !older {
			b.leases.older = false
		}
	}
	floor := b.leases.floor()
	if floor == math.MaxUint64 {
		return nil
	}
	return s.walk(leasePrefix, leaseScanStart(b.epoch, floor), p, func(k []byte) (store.Key, bool, bool) {
		epoch, until, key, ok := parseLeaseKey(k)
		if !ok {
			return store.Key{}, false, true
		}
		// This epoch's leases from the first that holds on hold too.
		return key, true, b.lapse(epoch, until, s.req.Now) != ""
	}, nil)
}

// due is a pass over a due index (q/ or f/: <DueAt><provider>/<id>) up to
// the claim's time; accept, if set, must also hold of the delivery.
func (s *claimScan) due(prefix string, p *claimPass, accept func(d *store.Delivery) bool) error {
	return s.walk(prefix, nil, p, func(k []byte) (store.Key, bool, bool) {
		at, key, ok := parseTimeKey(prefix, k)
		if ok && at.After(s.req.Now) {
			return store.Key{}, false, false
		}
		return key, ok, true
	}, accept)
}

// walk runs pass p over the index under prefix from start (nil: its
// first key). Keys of the providers the claim skips are passed over
// without being counted. parse reads an index key: the record's key, whether the
// key could be read, and whether the walk goes on (false: past the last
// candidate). The index keys are read a chunk at a time, and the records
// behind them between chunks, never under an open iterator.
func (s *claimScan) walk(prefix string, start []byte, p *claimPass, parse func(k []byte) (store.Key, bool, bool), accept func(d *store.Delivery) bool) error {
	for !p.done() {
		chunk := min(p.budget-p.examined, max(p.need-p.took, 16))
		var keys []store.Key
		var last []byte
		more, full := true, false
		err := s.w.scanFrom(prefix, start, func(k []byte) bool {
			key, ok, goOn := parse(k)
			if !goOn {
				more = false
				return false
			}
			last = append(last[:0], k...)
			if ok && !s.taken[key] && !s.skip[key.Provider] {
				keys = append(keys, key)
			}
			full = len(keys) >= chunk
			return !full
		})
		if err != nil {
			return err
		}
		for _, k := range keys {
			if p.done() {
				return nil
			}
			p.examined++
			took, err := s.try(k, accept)
			if err != nil {
				return err
			}
			if took {
				p.took++
			}
		}
		if !more || !full {
			return nil
		}
		start = append(last, 0) // the first key after the last one read
	}
	return nil
}

// try takes the record under k if it is still claimable (and accept
// holds, if set) and its route has room, and reports whether it did.
func (s *claimScan) try(k store.Key, accept func(d *store.Delivery) bool) (bool, error) {
	d, exp, err := s.w.delivery(k)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	lapse, ok := s.b.stillClaimable(&d, *s.req)
	if !ok || (accept != nil && !accept(&d)) {
		return false, nil
	}
	rec, err := s.w.recordOnly(k)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil // expired with its index entries racing behind
	}
	if err != nil {
		return false, err
	}
	rec.Delivery = d
	if !s.hasRoom(rec) {
		return false, nil
	}
	s.taken[k] = true
	s.out = append(s.out, pick{key: k, rec: rec, old: d, exp: exp, lapse: lapse})
	return true, nil
}

// hasRoom reports whether rec's route may give this claim one more record,
// and counts it if so.
func (s *claimScan) hasRoom(rec *store.Record) bool {
	if s.room == nil {
		return true
	}
	r := s.req.Route(rec)
	n, limited := s.room[r]
	if !limited {
		return true
	}
	if n <= 0 {
		return false
	}
	s.room[r] = n - 1
	return true
}

// lapse says why a lease of epoch until until has lapsed at now, or ""
// if it holds: every lease of an earlier open lapsed with it, and one of
// this open lapses at its end.
func (b *Badger) lapse(epoch uint64, until, now time.Time) string {
	switch {
	case epoch < b.epoch:
		return store.LapseRestart
	case !until.After(now):
		return store.LapseExpired
	}
	return ""
}

// stillClaimable checks the delivery state behind a candidate (an index
// entry may be stale) and returns why its lease lapsed ("" if it had none).
func (b *Badger) stillClaimable(d *store.Delivery, req store.ClaimRequest) (lapse string, ok bool) {
	if d.State == store.StateForwarding {
		why := b.lapse(ownerEpoch(d.Lease.Owner), d.Lease.Until, req.Now)
		return why, why != ""
	}
	if len(req.Keys) > 0 {
		return "", true
	}
	due := d.State == store.StateQueued || d.State == store.StateFailed
	return "", due && !d.DueAt.IsZero() && !d.DueAt.After(req.Now)
}
