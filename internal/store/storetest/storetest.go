// Package storetest is the conformance suite of the store.Store contract.
// Every backend runs it on real storage:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{Open: ..., Reopen: ...})
//	}
//
// The suite injects every time the contract takes (ClaimRequest.Now, the
// times of records, Expire's now) and never sleeps, so a store under test
// must honour ClaimRequest.Now for due times and leases, or, if it measures
// them by its own clock (a shared database's now()), let the harness set
// that clock (Harness.SetClock) to the time of each claim. Records expire a
// month after a base time an hour ahead of the wall clock, so a store that
// also drops expired records by its own clock (Badger's TTL) keeps them
// for the length of a test.
package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Harness tells the suite how to open the store under test.
type Harness struct {
	// Open opens a new, empty store for one test; the harness closes it
	// when the test ends (t.Cleanup). Required.
	Open func(t *testing.T) store.Store

	// Reopen closes s and opens the same data again as a new handle, as a
	// process restart does; the harness closes the new handle when the
	// test ends. The restart tests expect every lease s held to have
	// lapsed for the new handle (on Badger, a new epoch). Nil skips them.
	Reopen func(t *testing.T, s store.Store) store.Store

	// OpenLeaseTerm opens a new, empty store whose leases must be renewed
	// within term, with LeaseTerm() == term. If nil, the lease-term tests
	// run on Open's stores when their LeaseTerm() is positive, and are
	// skipped otherwise. (Every store's lease lapses at its Until; the
	// suite checks that on Open's stores too.)
	OpenLeaseTerm func(t *testing.T, term time.Duration) store.Store

	// RestartReason, if set, is the LastError a claim must give a record
	// whose lease lapsed because its owner is gone (Reopen); otherwise
	// any non-empty text passes.
	RestartReason string

	// ExpiredReason, if set, is the LastError a claim must give a record
	// whose lease ran out; otherwise any non-empty text passes.
	ExpiredReason string

	// SetClock, if set, is called before every Claim with the claim's
	// time, for a store that measures due times and leases by its own
	// clock rather than ClaimRequest.Now: the harness sets the store's
	// clock to now. Lease ends given to the store (Insert, Renew) are then
	// read relative to that clock. Nil for stores that honour
	// ClaimRequest.Now.
	SetClock func(s store.Store, now time.Time)

	// Check, if set, checks the internal consistency of s (its indexes
	// against its records, say). The suite runs it after every step of
	// the model test and at the end of every test on each store still
	// open; an error fails the test. It must return store.ErrClosed for
	// a closed store.
	Check func(s store.Store) error
}

// Run runs the conformance suite against the stores h opens.
func Run(t *testing.T, h Harness) {
	if h.Open == nil {
		t.Fatal("storetest: Harness.Open is required")
	}
	if h.Check != nil {
		h.Open = checked(h.Open, h.Check)
		if h.Reopen != nil {
			reopen := h.Reopen
			h.Reopen = func(t *testing.T, s store.Store) store.Store {
				return checked(func(t *testing.T) store.Store { return reopen(t, s) }, h.Check)(t)
			}
		}
		if h.OpenLeaseTerm != nil {
			open := h.OpenLeaseTerm
			h.OpenLeaseTerm = func(t *testing.T, term time.Duration) store.Store {
				return checked(func(t *testing.T) store.Store { return open(t, term) }, h.Check)(t)
			}
		}
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"InsertThenGet", testInsertThenGet},
		{"InsertDuplicate", testInsertDuplicate},
		{"InsertForwarding", testInsertForwarding},
		{"InsertCompletesTask", testInsertCompletesTask},
		{"InsertTooLarge", testInsertTooLarge},
		{"CodeBytes", testCodeBytes},
		{"UpdateDelivery", testUpdateDelivery},
		{"UpdateDeliveryFnError", testUpdateDeliveryFnError},
		{"UpdateDeliveryLeaseInvariant", testUpdateDeliveryLeaseInvariant},
		{"ClaimDueEarliestFirst", testClaimDueEarliestFirst},
		{"ClaimLimit", testClaimLimit},
		{"ClaimDecideParks", testClaimDecideParks},
		{"ClaimDecideRecord", testClaimDecideRecord},
		{"ClaimKeys", testClaimKeys},
		{"ClaimConcurrent", testClaimConcurrent},
		{"ClaimFair", testClaimFair},
		{"ClaimRoom", testClaimRoom},
		{"ClaimSkipBudget", testClaimSkipBudget},
		{"Restart", testRestart},
		{"LeaseTerm", testLeaseTerm},
		{"Expire", testExpire},
		{"ExpireLimit", testExpireLimit},
		{"List", testList},
		{"Tasks", testTasks},
		{"DueTasks", testDueTasks},
		{"TaskAccount", testTaskAccount},
		{"DueTasksAccounts", testDueTasksAccounts},
		{"ListTaskPageAccount", testListTaskPageAccount},
		{"CountsByAccount", testCountsByAccount},
		{"Counts", testCounts},
		{"ListTasks", testListTasks},
		{"ListPage", testListPage},
		{"ListTaskPage", testListTaskPage},
		{"Purge", testPurge},
		{"ErasePayloads", testErasePayloads}, {"EraseBatchPastStaleEntries", testEraseBatchPastStaleEntries},
		{"Ages", testAges},
		{"History", testHistory},
		{"HistoryMinutes", testHistoryMinutes},
		{"Close", testClose},
		{"Model", testModel},
		{"VerifyFields", testVerifyFields},
		{"QuarantinedKeepsTaskPending", testQuarantinedKeepsTaskPending},
		{"ResultBeforeSubmission", testResultBeforeSubmission},
		{"UpdateRecord", testUpdateRecord},
		{"UpdateRecordReleases", testUpdateRecordReleases},
		{"ExpiredState", testExpiredState},
		{"Pauses", testPauses}, {"ClaimSkipProviders", testClaimSkipProviders},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

// claimAt makes the claim req on s, first setting the store's clock to
// req.Now if the harness keeps one.
func (h Harness) claimAt(s store.Store, req store.ClaimRequest) ([]*store.Record, error) {
	if h.SetClock != nil {
		h.SetClock(s, req.Now)
	}
	return s.Claim(ctx, req)
}

// checked wraps open so that check runs on the store at the end of the
// test, before the harness closes it.
func checked(open func(t *testing.T) store.Store, check func(store.Store) error) func(t *testing.T) store.Store {
	return func(t *testing.T) store.Store {
		t.Helper()
		s := open(t)
		t.Cleanup(func() {
			if err := check(s); err != nil && !errors.Is(err, store.ErrClosed) {
				t.Errorf("store consistency at the end of the test: %v", err)
			}
		})
		return s
	}
}

// leaseTermStore opens a store whose leases lapse by time, or skips t.
func leaseTermStore(t *testing.T, h Harness) store.Store {
	t.Helper()
	if h.OpenLeaseTerm != nil {
		s := h.OpenLeaseTerm(t, 10*time.Minute)
		if s.LeaseTerm() <= 0 {
			t.Fatalf("OpenLeaseTerm gave a store with LeaseTerm() = %s", s.LeaseTerm())
		}
		return s
	}
	s := h.Open(t)
	if s.LeaseTerm() <= 0 {
		t.Skip("the store's leases are not renewed (LeaseTerm 0) and the harness has no OpenLeaseTerm")
	}
	return s
}

func checkReason(t *testing.T, what, got, want string) {
	t.Helper()
	switch {
	case want != "" && got != want:
		t.Errorf("%s: last error %q, want %q", what, got, want)
	case got == "":
		t.Errorf("%s: no last error; a lapsed lease must say why", what)
	}
}

// RunListPage runs only the ListPage test (for a store with more than one
// way to list, to run it once per way).
func RunListPage(t *testing.T, h Harness) { testListPage(t, h) }
