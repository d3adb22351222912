package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// testModel drives a store with a long random sequence of inserts,
// updates, claims (due and by key), renewals and restarts, and after every
// step compares each record's delivery state with a model of the contract.
// It catches index entries left behind (a record claimed when it should not
// be, or not claimed when due) that single-step tests miss.
func testModel(t *testing.T, h Harness) {
	t.Run("restarts", func(t *testing.T) {
		if h.Reopen == nil {
			t.Skip("the harness has no Reopen")
		}
		runModel(t, h, h.Open(t), 1)
	})
	t.Run("lease term", func(t *testing.T) {
		runModel(t, h, leaseTermStore(t, h), 2)
	})
}

// model is the expected state of a store.
type model struct {
	t     *testing.T
	h     Harness
	s     store.Store
	rnd   *rand.Rand
	now   time.Time
	t0    time.Time
	term  time.Duration // the store's lease term, 0 if leases are not renewed
	lease time.Duration // the lease claims ask for
	recs  map[string]*store.Delivery
	recv  map[string]time.Time // each record's ReceivedAt
	order []string             // ids in insertion order
	step  int
}

const modelSteps = 400

func runModel(t *testing.T, h Harness, s store.Store, seed uint64) {
	t0 := base()
	m := &model{
		t: t, h: h, s: s, rnd: rand.New(rand.NewPCG(seed, 0x5eed)), now: t0, t0: t0,
		term: s.LeaseTerm(), lease: leaseLen, recs: map[string]*store.Delivery{}, recv: map[string]time.Time{},
	}
	if m.term > 0 {
		m.lease = m.term
	}
	for m.step = 0; m.step < modelSteps && !t.Failed(); m.step++ {
		switch n := m.rnd.IntN(100); {
		case n < 18 || len(m.order) < 3:
			m.insert()
		case n < 22:
			m.insertDuplicate()
		case n < 45:
			m.update()
		case n < 55:
			m.now = m.now.Add(time.Duration(m.rnd.IntN(40)) * time.Second)
		case n < 75:
			m.claim()
		case n < 85:
			m.claimKeys()
		case n < 93:
			m.renew()
		default:
			if h.Reopen != nil && m.term == 0 {
				m.s = h.Reopen(t, m.s)
			} else {
				m.now = m.now.Add(m.lease / 2)
			}
		}
		m.check()
	}
}

func (m *model) fatalf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("step %d (t0%+v): %s", m.step, m.now.Sub(m.t0), fmt.Sprintf(format, args...))
}

func (m *model) pick() string { return m.order[m.rnd.IntN(len(m.order))] }

// randomDelivery is a delivery state in state st, due or leased around now.
func (m *model) randomDelivery(st store.State) store.Delivery {
	d := store.Delivery{State: st, Attempts: m.rnd.IntN(4), UpdatedAt: m.now}
	switch st {
	case store.StateQueued, store.StateFailed:
		d.DueAt = m.now.Add(time.Duration(m.rnd.IntN(150)-30) * time.Second)
		if st == store.StateFailed {
			d.Failures, d.LastStatus, d.LastError = d.Attempts, 503, "app answered 503"
		}
	case store.StateForwarding:
		d.Attempts++
		d.Lease.Until = m.now.Add(time.Duration(1+m.rnd.IntN(90)) * time.Second)
	case store.StateRejected:
		d.LastStatus = 422
	}
	if d.Attempts > 0 && m.rnd.IntN(2) == 0 {
		d.StartAttempt(store.SourceManual, m.now.Add(-time.Second))
		if st != store.StateForwarding {
			d.EndAttempt(d.Attempts, m.now, d.LastStatus, store.OutcomeFailed, d.LastError)
		}
	}
	return d
}

func (m *model) randomState() store.State { return store.States[m.rnd.IntN(len(store.States))] }

func (m *model) insert() {
	id := fmt.Sprintf("m%03d", len(m.order))
	d := m.randomDelivery(m.randomState())
	insert(m.t, m.s, newRecord(id, m.now, d))
	if d.State == store.StateForwarding {
		d.Lease.Owner = m.s.Owner()
	}
	m.recs[id] = &d
	m.recv[id] = m.now
	m.order = append(m.order, id)
}

func (m *model) insertDuplicate() {
	id := m.pick()
	res, err := m.s.Insert(ctx, newRecord(id, m.now, m.randomDelivery(m.randomState())))
	if err != nil || res.Existing == nil {
		m.fatalf("duplicate Insert(%s) = %+v, %v; want the existing record", id, res, err)
	}
	if d := diffDelivery(res.Existing.Delivery, *m.recs[id]); d != "" {
		m.fatalf("duplicate Insert(%s): Existing %s", id, d)
	}
}

func (m *model) update() {
	id := m.pick()
	next := m.randomDelivery(m.randomState())
	if next.State == store.StateForwarding && m.rnd.IntN(2) == 0 {
		next.Lease.Owner = m.s.Owner() // a forward recorded by hand under this handle
	}
	skip := m.rnd.IntN(6) == 0
	got, err := m.s.UpdateDelivery(ctx, key(id), func(d *store.Delivery) error {
		*d = next
		if skip {
			return store.ErrSkip
		}
		return nil
	})
	switch {
	case skip && !errors.Is(err, store.ErrSkip), !skip && err != nil:
		m.fatalf("UpdateDelivery(%s, skip %v): %v", id, skip, err)
	case skip:
	default:
		if next.State == store.StateForwarding {
			next.Lease.Owner = m.s.Owner()
			next.DueAt = time.Time{}
		} else {
			next.Lease = store.Lease{}
		}
		*m.recs[id] = next
	}
	if d := diffDelivery(got, *m.recs[id]); d != "" {
		m.fatalf("UpdateDelivery(%s, skip %v) returned %s", id, skip, d)
	}
}

// lapsed says whether d is forwarding under a lease that no longer holds
// at now, and why: "restart" (its owner is gone) or "expired".
func (m *model) lapsed(d *store.Delivery) string {
	switch {
	case d.State != store.StateForwarding:
		return ""
	case d.Lease.Owner != m.s.Owner():
		return "restart"
	case !d.Lease.Until.After(m.now):
		return "expired"
	}
	return ""
}

func (m *model) due(d *store.Delivery) bool {
	return (d.State == store.StateQueued || d.State == store.StateFailed) && !d.DueAt.IsZero() && !d.DueAt.After(m.now)
}

// decide is the model's Decide: a record is parked at its sixth attempt;
// the interrupted attempt ends and the new one starts in the history.
func (m *model) decide(d *store.Delivery, lapsed bool) {
	if lapsed {
		d.Interrupts++
		d.EndAttempt(d.Attempts, m.now, 0, store.OutcomeInterrupted, d.LastError)
	}
	if d.Attempts >= 5 {
		d.State, d.DueAt, d.LastError = store.StateParked, time.Time{}, "parked"
		return
	}
	d.State = store.StateForwarding
	d.Attempts++
	d.StartAttempt(store.SourceReplay, m.now)
}

// claimed checks a claimed record against the model and applies it.
func (m *model) claimed(r *store.Record) {
	id := r.ID
	old, ok := m.recs[id]
	if !ok {
		m.fatalf("claim returned unknown record %s", id)
	}
	want := *old
	why := m.lapsed(old)
	if why != "" {
		want.LastStatus, want.Lease = 0, store.Lease{}
		reason := m.h.RestartReason
		if why == "expired" {
			reason = m.h.ExpiredReason
		}
		if reason == "" {
			reason = r.LastError
		}
		want.LastError = reason
		if r.LastError == "" {
			m.fatalf("claim of %s (lapsed: %s) gave no last error", id, why)
		}
	}
	m.decide(&want, why != "")
	if want.State == store.StateForwarding {
		want.Lease = store.Lease{Owner: m.s.Owner(), Until: m.now.Add(m.lease)}
		want.DueAt = time.Time{}
	} else {
		want.Lease = store.Lease{}
	}
	if d := diffDelivery(r.Delivery, want); d != "" {
		m.fatalf("claimed %s (lapsed %q, was %s): %s", id, why, old.State, d)
	}
	*old = want
}

func (m *model) claim() {
	limit := 1 + m.rnd.IntN(6)
	var lapsed, due []string
	for _, id := range m.order {
		d := m.recs[id]
		switch {
		case m.lapsed(d) != "":
			lapsed = append(lapsed, id)
		case m.due(d):
			due = append(due, id)
		}
	}
	recs, err := m.h.claimAt(m.s, store.ClaimRequest{Now: m.now, Limit: limit, Lease: m.lease, Decide: m.decide})
	if err != nil {
		m.fatalf("Claim: %v", err)
	}
	got := ids(recs)
	if want := min(limit, len(lapsed)+len(due)); len(got) != want {
		m.fatalf("Claim(limit %d) = %v; want %d of lapsed %v and due %v", limit, got, want, lapsed, due)
	}
	seen := map[string]bool{}
	for _, id := range got {
		if seen[id] {
			m.fatalf("Claim returned %s twice: %v", id, got)
		}
		seen[id] = true
		if !slices.Contains(lapsed, id) && !slices.Contains(due, id) {
			m.fatalf("Claim returned %s, neither lapsed %v nor due %v (state %+v)", id, lapsed, due, *m.recs[id])
		}
	}
	// Earliest first: no due record is passed over for a later one.
	for _, id := range got {
		if !slices.Contains(due, id) {
			continue
		}
		for _, other := range due {
			if !seen[other] && m.recs[other].DueAt.Before(m.recs[id].DueAt) {
				m.fatalf("Claim took %s (due t0%+v) before %s (due t0%+v)", id, m.recs[id].DueAt.Sub(m.t0), other, m.recs[other].DueAt.Sub(m.t0))
			}
		}
	}
	for _, r := range recs {
		m.claimed(r)
	}
}

func (m *model) claimKeys() {
	var keys []store.Key
	want := map[string]bool{}
	for range 1 + m.rnd.IntN(2) {
		id := m.pick()
		keys = append(keys, key(id))
		d := m.recs[id]
		want[id] = d.State != store.StateForwarding || m.lapsed(d) != ""
	}
	if m.rnd.IntN(4) == 0 {
		keys = append(keys, key("absent"))
	}
	recs, err := m.h.claimAt(m.s, store.ClaimRequest{Now: m.now, Limit: len(keys), Keys: keys, Lease: m.lease, Decide: m.decide})
	if err != nil {
		m.fatalf("Claim(keys %v): %v", keys, err)
	}
	got := map[string]bool{}
	for _, r := range recs {
		if got[r.ID] {
			m.fatalf("Claim(keys %v) returned %s twice", keys, r.ID)
		}
		got[r.ID] = true
	}
	for id, ok := range want {
		if got[id] != ok {
			m.fatalf("Claim(keys %v): claimed %s = %v, want %v (state %+v)", keys, id, got[id], ok, *m.recs[id])
		}
	}
	for _, r := range recs {
		m.claimed(r)
	}
}

func (m *model) renew() {
	id := m.pick()
	d := m.recs[id]
	mine := d.State == store.StateForwarding && d.Lease.Owner == m.s.Owner()
	if mine && !d.Lease.Until.After(m.now) {
		return // run out but not yet claimed: the contract does not say
	}
	holds := mine
	attempt := d.Attempts
	if m.rnd.IntN(5) == 0 {
		attempt--
		holds = false
	}
	until := m.now.Add(time.Duration(1+m.rnd.IntN(120)) * time.Second)
	err := m.s.Renew(ctx, key(id), attempt, until)
	switch {
	case holds && err != nil:
		m.fatalf("Renew(%s, %d) of a held lease: %v", id, attempt, err)
	case holds:
		d.Lease.Until = until
	case !errors.Is(err, store.ErrLeaseLost):
		m.fatalf("Renew(%s, %d) of a lease not held (state %+v): %v, want ErrLeaseLost", id, attempt, *d, err)
	}
}

// check compares every record with the model.
func (m *model) check() {
	if m.h.Check != nil {
		if err := m.h.Check(m.s); err != nil {
			m.fatalf("store consistency: %v", err)
		}
	}
	for _, id := range m.order {
		r, err := m.s.Get(ctx, key(id))
		if err != nil {
			m.fatalf("Get(%s): %v", id, err)
		}
		if d := diffDelivery(r.Delivery, *m.recs[id]); d != "" {
			m.fatalf("record %s: %s", id, d)
		}
	}
	want := map[store.State]int64{}
	for _, d := range m.recs {
		want[d.State]++
	}
	if err := checkCounts(m.s, want, -1); err != nil {
		m.fatalf("%v", err)
	}
	var oldest time.Time
	for id, d := range m.recs {
		if (d.State == store.StateFailed || d.State == store.StateForwarding) && (oldest.IsZero() || m.recv[id].Before(oldest)) {
			oldest = m.recv[id]
		}
	}
	if err := checkAge(m.s, "OldestUndelivered", func(a store.Ages) map[string]time.Time { return a.OldestUndelivered }, oldest); err != nil {
		m.fatalf("%v", err)
	}
	if m.step%50 == 49 {
		recs, err := m.s.List(ctx, store.Filter{}, 10*len(m.order))
		if err != nil || len(recs) != len(m.order) {
			m.fatalf("List = %d records, %v; want %d", len(recs), err, len(m.order))
		}
	}
}
