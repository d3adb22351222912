package store

import "time"

// ApplyUpdate is the read-modify step every UpdateRecord and UpdateTask
// shares: it reads the stored value with read, applies fn (the caller's
// update function) to a copy and vets the copy with vet, if set (a driver
// fixes what fn may not change, or refuses what it cannot store). old is
// what read returned (nil if read failed): it is what the update answers
// when fn or vet fails (ErrSkip included), nothing being written. cur is
// the changed copy to write, nil on any error.
func ApplyUpdate[T any](read func() (*T, error), fn, vet func(*T) error) (old, cur *T, err error) {
	old, err = read()
	if err != nil {
		return nil, nil, err
	}
	c := *old
	if err := fn(&c); err != nil {
		return old, nil, err
	}
	if vet != nil {
		if err := vet(&c); err != nil {
			return old, nil, err
		}
	}
	return old, &c, nil
}

// KeepRecord returns UpdateRecord's vet for ApplyUpdate: whatever fn did,
// the record keeps key, and its delivery the lease invariant
// (Delivery.OwnLease, owner the store handle's).
func KeepRecord(key Key, owner string) func(*Record) error {
	return func(r *Record) error {
		r.Provider, r.ID = key.Provider, key.ID
		r.OwnLease(owner)
		return nil
	}
}

// OwnLease keeps the lease invariant of d: set (to owner, if no owner is
// named) while forwarding, with no due time; empty otherwise.
func (d *Delivery) OwnLease(owner string) {
	if d.State != StateForwarding {
		d.Lease = Lease{}
		return
	}
	if d.Lease.Owner == "" {
		d.Lease.Owner = owner
	}
	d.DueAt = time.Time{}
}
