package badgerstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/storetest"
	"github.com/dgraph-io/badger/v4"
)

// The conformance suite (storetest, run by [TestBadgerConformance])
// covers the Store contract; the tests here cover what is Badger's own:
// group commit, the answers of a batch whose commit fails, the commit's
// retry paths, epochs and the stored format.

var ctx = context.Background()

// openTestBadger opens a Badger store in dir and closes it at the end of
// the test (Close is idempotent, so a test may close it earlier).
func openTestBadger(t testing.TB, opts Options) *Badger {
	t.Helper()
	b, err := openChecked(opts)
	if err != nil {
		t.Fatalf("opening badger in %s: %v", opts.Dir, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing badger: %v", err)
		}
	})
	return b
}

// t0 is the time the tests' records start from: a whole second an hour
// ahead of the wall clock, so that their Badger TTLs (a month later) do
// not run out during a test.
var t0 = time.Now().UTC().Truncate(time.Second).Add(time.Hour)

func key(id string) store.Key { return store.Key{Provider: "captchaai", ID: id} }

// testRecord is a record in state st received at t0: due at t0 if queued
// or failed, leased for a minute if forwarding.
func testRecord(id string, st store.State) *store.Record {
	r := &store.Record{
		Provider:   "captchaai",
		ID:         id,
		Code:       "CODE-" + id,
		Source:     store.SourceCallback,
		ReceivedAt: t0,
		Server:     "srv0",
		Request: store.Request{
			Method: http.MethodPost,
			URI:    "/cb?id=" + id,
			Host:   "example.com",
			Header: http.Header{"Content-Type": {"application/x-www-form-urlencoded"}},
			Body:   []byte("id=" + id + "&code=CODE-" + id),
		},
		Delivery:  store.Delivery{State: st, UpdatedAt: t0},
		ExpiresAt: t0.Add(30 * 24 * time.Hour),
	}
	switch st {
	case store.StateQueued, store.StateFailed:
		r.DueAt = t0
	case store.StateForwarding:
		r.Attempts = 1
		r.Lease.Until = t0.Add(time.Minute)
	}
	return r
}

func mustInsert(t *testing.T, b *Badger, recs ...*store.Record) {
	t.Helper()
	for _, r := range recs {
		res, err := b.Insert(ctx, r)
		if err != nil || res.Existing != nil {
			t.Fatalf("Insert(%s) = %+v, %v", r.Key(), res, err)
		}
	}
}

func mustGet(t *testing.T, b *Badger, k store.Key) *store.Record {
	t.Helper()
	r, err := b.Get(ctx, k)
	if err != nil {
		t.Fatalf("Get(%s): %v", k, err)
	}
	return r
}

// forward is the conformance suite's usual Decide.
var forward = storetest.Forward

func claimAt(t *testing.T, b *Badger, now time.Time, limit int, keys ...store.Key) []*store.Record {
	t.Helper()
	recs, err := b.Claim(ctx, store.ClaimRequest{Now: now, Limit: limit, Keys: keys, Lease: time.Minute, Decide: forward})
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	return recs
}

func recIDs(recs []*store.Record) string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return strings.Join(out, ",")
}

func checkIndexesOK(t *testing.T, b *Badger) {
	t.Helper()
	if err := CheckIndexes(b); err != nil {
		t.Errorf("indexes: %v", err)
	}
}

// snapshot is every key of the database with its value and TTL.
func snapshot(t *testing.T, b *Badger) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := b.view(func(txn *badger.Txn) error {
		return eachEntry(txn, func(k, v []byte, expiresAt uint64) { out[string(k)] = fmt.Sprintf("%s ttl %d", v, expiresAt) })
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameSnapshot(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q is %q, was %q", what, k, got[k], v)
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%s: new key %q = %q", what, k, v)
		}
	}
}

// errInjected is the failure the commit gate injects.
var errInjected = errors.New("injected commit failure")

// gate is a BeforeCommit hook. Armed, it holds the next commit until
// released (the plug, so that operations queue up behind it) and fails
// the one after if asked to: that commit carries every operation queued
// meanwhile, in one batch.
type gate struct {
	mu      sync.Mutex
	calls   int
	plug    int           // the commit to hold, 0 for none
	fail    map[int]bool  // commits to fail
	held    chan struct{} // closed once the plug's commit is held
	release chan struct{}
}

func (g *gate) hook(uint64) error {
	g.mu.Lock()
	g.calls++
	n, plug, fail := g.calls, g.plug, g.fail[g.calls]
	held, release := g.held, g.release
	g.mu.Unlock()
	if n == plug {
		close(held)
		<-release
	}
	if fail {
		return errInjected
	}
	return nil
}

// count is how many commits the gate has seen.
func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls
}

// failNext fails the next commit.
func (g *gate) failNext() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.fail == nil {
		g.fail = map[int]bool{}
	}
	g.fail[g.calls+1] = true
}

func openGated(t *testing.T) (*Badger, *gate) {
	g := &gate{}
	return openTestBadger(t, Options{Dir: t.TempDir(), BeforeCommit: g.hook}), g
}

// hold holds the committer on a plug (an update of a missing key, which
// writes nothing) until the returned release is called; release returns
// once the plug's commit is done. If fail is set, the commit after the
// plug's, which carries every operation queued meanwhile, fails.
func hold(t *testing.T, b *Badger, g *gate, fail bool) (release func()) {
	t.Helper()
	g.mu.Lock()
	g.plug = g.calls + 1
	g.held, g.release = make(chan struct{}), make(chan struct{})
	if fail {
		if g.fail == nil {
			g.fail = map[int]bool{}
		}
		g.fail[g.calls+2] = true
	}
	held, rel := g.held, g.release
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := b.UpdateDelivery(ctx, key("plug"), func(*store.Delivery) error { return nil }); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("plug: %v", err)
		}
	}()
	<-held
	return func() {
		close(rel)
		<-done
	}
}

// queued waits until n operations wait in the committer's queue. While the
// committer is held the queue only grows, so this waits for a condition
// (the operations have submitted), not for time to pass.
func queued(b *Badger, n int) {
	for b.committer.Queued() < n {
		runtime.Gosched()
	}
}

// inOneBatch runs ops so that the committer takes them into one batch, in
// order: it holds the committer on a plug, starts each op in turn once the
// one before is queued, then releases the plug. If fail is set, the
// batch's commit fails. It returns once every op has returned.
func inOneBatch(t *testing.T, b *Badger, g *gate, fail bool, ops ...func()) {
	t.Helper()
	release := hold(t, b, g, fail)
	var wg sync.WaitGroup
	for i, op := range ops {
		wg.Go(op)
		queued(b, i+1)
	}
	release()
	wg.Wait()
}

func TestBadgerGroupCommit(t *testing.T) {
	insertConcurrently := func(b *Badger, n int) uint64 {
		before := b.Commits()
		start := make(chan struct{})
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				res, err := b.Insert(ctx, testRecord(fmt.Sprint(1000+i), store.StateQueued))
				if err == nil && res.Existing != nil {
					err = fmt.Errorf("insert %d: unexpected duplicate", i)
				}
				errs <- err
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			mustGet(t, b, key(fmt.Sprint(1000+i)))
		}
		return b.Commits() - before
	}
	const n = 300
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	commits := insertConcurrently(b, n)
	t.Logf("%d concurrent inserts in %d commits", n, commits)
	if commits == 0 || commits > n/4 {
		t.Errorf("%d concurrent inserts took %d commits; want far fewer (group commit)", n, commits)
	}
	if got := len(claimAt(t, b, t0, 2*n)); got != n {
		t.Errorf("claim after the concurrent inserts: %d records, want %d", got, n)
	}
	checkIndexesOK(t, b)

	// The control: with batches of one, every insert is its own commit,
	// so the counter above counts transactions.
	one := openTestBadger(t, Options{Dir: t.TempDir(), MaxBatch: 1})
	if commits := insertConcurrently(one, 50); commits != 50 {
		t.Errorf("MaxBatch 1: 50 inserts took %d commits, want 50", commits)
	}
}

func TestBadgerConcurrentInsertOneKey(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	const n = 50
	type result struct {
		code string
		res  store.InsertResult
		err  error
	}
	start := make(chan struct{})
	results := make(chan result, n)
	proto := testRecord("77", store.StateForwarding)
	for i := range n {
		go func() {
			<-start
			r := cloneRecord(proto)
			r.Code = fmt.Sprint("C", i)
			res, err := b.Insert(ctx, r)
			results <- result{r.Code, res, err}
		}()
	}
	close(start)
	var winners []string
	var losers []*store.Record
	for range n {
		r := <-results
		switch {
		case r.err != nil:
			t.Fatalf("insert %s: %v", r.code, r.err)
		case r.res.Existing == nil:
			winners = append(winners, r.code)
		default:
			losers = append(losers, r.res.Existing)
		}
	}
	if len(winners) != 1 {
		t.Fatalf("%d inserts stored their record (%v); want exactly 1", len(winners), winners)
	}
	for _, e := range losers {
		if e.Code != winners[0] {
			t.Errorf("a refused insert saw code %q, want the winner's %q", e.Code, winners[0])
		}
	}
	if got := mustGet(t, b, key("77")); got.Code != winners[0] {
		t.Errorf("stored code %q, want %q", got.Code, winners[0])
	}
	checkIndexesOK(t, b)
}

// TestBadgerFailedCommitAnswersNothing: when a batch's commit fails, no
// operation of the batch gets an answer, not even one that wrote nothing
// itself but read what an earlier operation of the batch wrote (a
// "duplicate" of a record that was never stored, a skip of a state that
// never was, "nothing to claim" because of a claim that never happened).
func TestBadgerFailedCommitAnswersNothing(t *testing.T) {
	tests := []struct {
		name   string
		setup  func(t *testing.T, b *Badger)
		first  func(b *Badger) error
		second func(b *Badger) error
		after  func(t *testing.T, b *Badger)
	}{{
		name: "insert and its duplicate",
		first: func(b *Badger) error {
			_, err := b.Insert(ctx, testRecord("A", store.StateForwarding))
			return err
		},
		second: func(b *Badger) error {
			res, err := b.Insert(ctx, testRecord("A", store.StateForwarding))
			if err == nil && res.Existing != nil {
				return fmt.Errorf("duplicate of %s (code %s)", res.Existing.Key(), res.Existing.Code)
			}
			return err
		},
		after: func(t *testing.T, b *Badger) {
			if r, err := b.Get(ctx, key("A")); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Get(A) after the failed commit = %+v, %v; want ErrNotFound", r, err)
			}
			mustInsert(t, b, testRecord("A", store.StateForwarding))
		},
	}, {
		name:  "update and a skip that saw it",
		setup: func(t *testing.T, b *Badger) { mustInsert(t, b, testRecord("A", store.StateQueued)) },
		first: func(b *Badger) error {
			_, err := b.UpdateDelivery(ctx, key("A"), func(d *store.Delivery) error { d.State, d.DueAt = store.StateDelivered, time.Time{}; return nil })
			return err
		},
		second: func(b *Badger) error {
			_, err := b.UpdateDelivery(ctx, key("A"), func(d *store.Delivery) error {
				if d.State == store.StateDelivered {
					return store.ErrSkip
				}
				d.State = store.StateParked
				return nil
			})
			return err
		},
		after: func(t *testing.T, b *Badger) {
			if got := mustGet(t, b, key("A")); got.State != store.StateQueued {
				t.Errorf("A after the failed commit: %s, want queued", got.State)
			}
		},
	}, {
		name:  "claim and a claim by key that saw it",
		setup: func(t *testing.T, b *Badger) { mustInsert(t, b, testRecord("A", store.StateQueued)) },
		first: func(b *Badger) error {
			_, err := b.Claim(ctx, store.ClaimRequest{Now: t0, Limit: 1, Lease: time.Minute, Decide: forward})
			return err
		},
		second: func(b *Badger) error {
			recs, err := b.Claim(ctx, store.ClaimRequest{Now: t0, Limit: 1, Keys: []store.Key{key("A")}, Lease: time.Minute, Decide: forward})
			if err == nil && len(recs) == 0 {
				return errors.New("nothing claimed: A's lease holds")
			}
			return err
		},
		after: func(t *testing.T, b *Badger) {
			if got := recIDs(claimAt(t, b, t0, 10)); got != "A" {
				t.Errorf("claim after the failed commit = %q, want A", got)
			}
		},
	}, {
		name:  "forward's end and a renewal that saw it",
		setup: func(t *testing.T, b *Badger) { mustInsert(t, b, testRecord("A", store.StateForwarding)) },
		first: func(b *Badger) error {
			_, err := b.UpdateDelivery(ctx, key("A"), func(d *store.Delivery) error { d.State, d.DueAt = store.StateFailed, t0.Add(time.Hour); return nil })
			return err
		},
		second: func(b *Badger) error { return b.Renew(ctx, key("A"), 1, t0.Add(time.Hour)) },
		after: func(t *testing.T, b *Badger) {
			if err := b.Renew(ctx, key("A"), 1, t0.Add(time.Hour)); err != nil {
				t.Errorf("Renew after the failed commit: %v", err)
			}
		},
	}, {
		name: "expiry and an update that saw the record gone",
		setup: func(t *testing.T, b *Badger) {
			r := testRecord("A", store.StateFailed)
			r.ExpiresAt = t0.Add(time.Hour)
			mustInsert(t, b, r)
		},
		first: func(b *Badger) error {
			gone, err := b.Expire(ctx, t0.Add(time.Hour), 10)
			if err == nil {
				return fmt.Errorf("expired %v", gone)
			}
			return err
		},
		second: func(b *Badger) error {
			_, err := b.UpdateDelivery(ctx, key("A"), func(d *store.Delivery) error { return nil })
			return err
		},
		after: func(t *testing.T, b *Badger) {
			mustGet(t, b, key("A"))
			if gone, err := b.Expire(ctx, t0.Add(time.Hour), 10); err != nil || len(gone) != 1 {
				t.Errorf("Expire after the failed commit = %v, %v; want A", gone, err)
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, g := openGated(t)
			if tc.setup != nil {
				tc.setup(t, b)
			}
			before := snapshot(t, b)
			var err1, err2 error
			inOneBatch(t, b, g, true,
				func() { err1 = tc.first(b) },
				func() { err2 = tc.second(b) },
			)
			if !errors.Is(err1, errInjected) {
				t.Errorf("first operation: %v, want the commit's failure", err1)
			}
			if !errors.Is(err2, errInjected) {
				t.Errorf("second operation: %v, want the commit's failure (its answer rests on the first's uncommitted write)", err2)
			}
			sameSnapshot(t, "after the failed commit", snapshot(t, b), before)
			tc.after(t, b)
			checkIndexesOK(t, b)
		})
	}
}

// TestBadgerFailedCommitChangesNothing: each kind of write, alone in a
// commit that fails, returns the failure and leaves every key as it was.
func TestBadgerFailedCommitChangesNothing(t *testing.T) {
	b, g := openGated(t)
	mustInsert(t, b, testRecord("q", store.StateQueued), testRecord("f", store.StateForwarding))
	if _, err := b.AddTask(ctx, &store.Task{Provider: "captchaai", ID: "t", State: store.TaskPending, NextPollAt: t0, ExpiresAt: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	ops := map[string]func() error{
		"Insert": func() error { _, err := b.Insert(ctx, testRecord("new", store.StateQueued)); return err },
		"UpdateDelivery": func() error {
			_, err := b.UpdateDelivery(ctx, key("q"), func(d *store.Delivery) error { d.State = store.StateDelivered; return nil })
			return err
		},
		"Claim": func() error {
			_, err := b.Claim(ctx, store.ClaimRequest{Now: t0, Limit: 10, Lease: time.Minute, Decide: forward})
			return err
		},
		"Claim by key": func() error {
			_, err := b.Claim(ctx, store.ClaimRequest{Now: t0.Add(time.Hour), Limit: 1, Keys: []store.Key{key("f")}, Lease: time.Minute, Decide: forward})
			return err
		},
		"Renew":  func() error { return b.Renew(ctx, key("f"), 1, t0.Add(time.Hour)) },
		"Expire": func() error { _, err := b.Expire(ctx, t0.Add(365*24*time.Hour), 10); return err },
		"AddTask": func() error {
			_, err := b.AddTask(ctx, &store.Task{Provider: "captchaai", ID: "u", State: store.TaskPending, NextPollAt: t0, ExpiresAt: t0.Add(time.Hour)})
			return err
		},
		"UpdateTask": func() error {
			_, err := b.UpdateTask(ctx, key("t"), func(tk *store.Task) error { tk.NextPollAt = t0.Add(time.Minute); return nil })
			return err
		},
	}
	for name, op := range ops {
		before := snapshot(t, b)
		g.failNext()
		if err := op(); !errors.Is(err, errInjected) {
			t.Errorf("%s in a failed commit: %v, want the commit's failure", name, err)
		}
		sameSnapshot(t, name+" in a failed commit", snapshot(t, b), before)
	}
	if got := recIDs(claimAt(t, b, t0, 10)); got != "q" {
		t.Errorf("claim after the failed commits = %q, want q", got)
	}
	checkIndexesOK(t, b)
}

// TestBadgerApplyFailsHalfWay: an operation that fails after it has
// prepared some of its writes leaves none of them, and the operations
// batched with it commit.
func TestBadgerApplyFailsHalfWay(t *testing.T) {
	t.Run("claim", func(t *testing.T) {
		b, g := openGated(t)
		a, bad, c := testRecord("a", store.StateQueued), testRecord("b", store.StateQueued), testRecord("c", store.StateDelivered)
		bad.DueAt = t0.Add(time.Second)
		mustInsert(t, b, a, bad)
		// b's delivery state is unreadable: the claim reaches it after
		// it has prepared a's lease.
		if err := b.db.Update(func(txn *badger.Txn) error { return txn.Set(deliveryKey(bad.Key()), []byte("{")) }); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, b)
		var claimErr, insertErr error
		var claimed []*store.Record
		inOneBatch(t, b, g, false,
			func() {
				claimed, claimErr = b.Claim(ctx, store.ClaimRequest{Now: t0.Add(time.Minute), Limit: 2, Lease: time.Minute, Decide: forward})
			},
			func() { _, insertErr = b.Insert(ctx, c) },
		)
		if claimErr == nil || !strings.Contains(claimErr.Error(), "decoding") {
			t.Errorf("claim over an unreadable state = %q, %v; want a decoding error", recIDs(claimed), claimErr)
		}
		if insertErr != nil {
			t.Errorf("insert batched with the failed claim: %v", insertErr)
		}
		after := snapshot(t, b)
		deleteInserted(after, c)
		sameSnapshot(t, "after the failed claim", after, before)
		if got := mustGet(t, b, key("a")); got.State != store.StateQueued || got.Attempts != 0 {
			t.Errorf("a after the failed claim: %s attempts %d, want queued, 0", got.State, got.Attempts)
		}
		if got := recIDs(claimAt(t, b, t0.Add(time.Minute), 1)); got != "a" {
			t.Errorf("claim of one = %q, want a", got)
		}
	})
	t.Run("update", func(t *testing.T) {
		b, g := openGated(t)
		mustInsert(t, b, testRecord("a", store.StateForwarding))
		c := testRecord("c", store.StateDelivered)
		before := snapshot(t, b)
		fnErr := errors.New("not this attempt")
		var updErr, insertErr error
		inOneBatch(t, b, g, false,
			func() {
				_, updErr = b.UpdateDelivery(ctx, key("a"), func(d *store.Delivery) error {
					d.State, d.DueAt, d.Lease = store.StateFailed, t0, store.Lease{}
					return fnErr
				})
			},
			func() { _, insertErr = b.Insert(ctx, c) },
		)
		if !errors.Is(updErr, fnErr) || insertErr != nil {
			t.Errorf("update = %v, insert = %v; want fn's error and success", updErr, insertErr)
		}
		after := snapshot(t, b)
		deleteInserted(after, c)
		sameSnapshot(t, "after the failed update", after, before)
		checkIndexesOK(t, b)
	})
}

// deleteInserted drops from a snapshot what inserting rec, the only
// delivered record, wrote: its record, delivery and received-index
// entries, its delivered count, its expiry bucket and its delivered
// watch.
func deleteInserted(snap map[string]string, rec *store.Record) {
	delete(snap, string(recordKey(rec.Key())))
	delete(snap, string(timeKey(deliveredPrefix, rec.UpdatedAt, rec.Key())))
	delete(snap, string(deliveryKey(rec.Key())))
	delete(snap, string(receivedIndexKey(rec.Key(), rec.ReceivedAt)))
	delete(snap, string(countKey(rec.Provider, store.StateDelivered)))
	delete(snap, string(bucketKey{sec: expiry(rec.ExpiresAt), provider: rec.Provider, state: store.StateDelivered}.key()))
}

// TestBadgerFlushFailureRerun: an operation whose writes Badger refuses
// (a key over Badger's 65000-byte limit) fails alone; the batch is run
// again without it and the others commit, in one commit.
func TestBadgerFlushFailureRerun(t *testing.T) {
	b, g := openGated(t)
	huge := testRecord(strings.Repeat("9", 70000), store.StateQueued)
	var errB, errHuge, errC error
	commits := b.Commits()
	inOneBatch(t, b, g, false,
		func() { _, errB = b.Insert(ctx, testRecord("b", store.StateQueued)) },
		func() { _, errHuge = b.Insert(ctx, huge) },
		func() { _, errC = b.Insert(ctx, testRecord("c", store.StateQueued)) },
	)
	if errB != nil || errC != nil {
		t.Errorf("inserts batched with the refused one: %v, %v", errB, errC)
	}
	if errHuge == nil {
		t.Error("insert of a key over Badger's limit succeeded")
	}
	if r, err := b.Get(ctx, huge.Key()); err == nil {
		t.Errorf("refused record is stored: %s", r.Code)
	}
	mustGet(t, b, key("b"))
	mustGet(t, b, key("c"))
	// The plug's commit, then the batch's: its first transaction was
	// discarded before it reached a commit.
	if got := b.Commits() - commits; got != 2 {
		t.Errorf("%d commits, want 2 (the plug, then the rerun batch)", got)
	}
	if got := g.count(); got != 2 {
		t.Errorf("BeforeCommit ran %d times, want 2", got)
	}
	if got := recIDs(claimAt(t, b, t0, 10)); got != "b,c" {
		t.Errorf("claim = %q, want b,c", got)
	}
	checkIndexesOK(t, b)
}

// TestBadgerTxnTooBigSplit: a batch over Badger's transaction size (two
// claims of records with long last errors, whose writes exceed what their
// size estimates said) is split in halves, each committed on its own; no
// record is claimed twice or lost.
func TestBadgerTxnTooBigSplit(t *testing.T) {
	b, g := openGated(t)
	const n = 1200
	longError := strings.Repeat("e", 2500)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			r := testRecord(fmt.Sprintf("%04d", i), store.StateFailed)
			r.LastError = longError
			_, err := b.Insert(ctx, r)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	commits := b.Commits()
	var first, second []*store.Record
	var err1, err2 error
	claim := func(recs *[]*store.Record, err *error) func() {
		return func() {
			*recs, *err = b.Claim(ctx, store.ClaimRequest{Now: t0, Limit: n / 2, Lease: time.Minute, Decide: forward})
		}
	}
	inOneBatch(t, b, g, false, claim(&first, &err1), claim(&second, &err2))
	if err1 != nil || err2 != nil {
		t.Fatalf("claims: %v, %v", err1, err2)
	}
	if got := b.Commits() - commits; got != 3 {
		t.Errorf("%d commits, want 3: the plug and the two halves of the split batch", got)
	}
	seen := map[string]bool{}
	for _, r := range append(first, second...) {
		if seen[r.ID] {
			t.Errorf("%s claimed twice", r.ID)
		}
		seen[r.ID] = true
		if r.State != store.StateForwarding || r.Attempts != 1 {
			t.Errorf("%s: %s attempts %d", r.ID, r.State, r.Attempts)
		}
	}
	if len(seen) != n {
		t.Errorf("%d records claimed, want %d", len(seen), n)
	}
	checkIndexesOK(t, b)
}

// TestBadgerCloseWaitsForQueuedWrites: Close lets the committer finish
// what was submitted before it, and refuses what comes after.
func TestBadgerCloseWaitsForQueuedWrites(t *testing.T) {
	dir := t.TempDir()
	g := &gate{}
	b := openTestBadger(t, Options{Dir: dir, BeforeCommit: g.hook})
	release := hold(t, b, g, false)
	insertDone, closeDone := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := b.Insert(ctx, testRecord("a", store.StateQueued))
		insertDone <- err
	}()
	queued(b, 1)
	go func() { closeDone <- b.Close() }()
	for b.Available() {
		runtime.Gosched()
	}
	// Close has begun and waits for the committer, which is held.
	if _, err := b.Insert(ctx, testRecord("b", store.StateQueued)); !errors.Is(err, store.ErrClosed) {
		t.Errorf("insert after Close began: %v, want ErrClosed", err)
	}
	select {
	case err := <-closeDone:
		t.Fatalf("Close returned (%v) before the queued insert was committed", err)
	default:
	}
	release()
	if err := <-insertDone; err != nil {
		t.Errorf("insert queued before Close: %v", err)
	}
	if err := <-closeDone; err != nil {
		t.Errorf("Close: %v", err)
	}
	b2 := openTestBadger(t, Options{Dir: dir})
	mustGet(t, b2, key("a"))
	if _, err := b2.Get(ctx, key("b")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("insert refused by Close was stored: %v", err)
	}
}

func TestBadgerReopenTakesNewEpoch(t *testing.T) {
	dir := t.TempDir()
	var owners []string
	for i := range 3 {
		b := openTestBadger(t, Options{Dir: dir})
		if b.epoch != uint64(i+1) || b.Owner() != fmt.Sprintf("badger:%d", i+1) {
			t.Errorf("open %d: epoch %d owner %q, want %d", i+1, b.epoch, b.Owner(), i+1)
		}
		owners = append(owners, b.Owner())
		if i == 0 {
			mustInsert(t, b, testRecord("a", store.StateForwarding))
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b := openTestBadger(t, Options{Dir: dir})
	got := mustGet(t, b, key("a"))
	if got.Lease.Owner != owners[0] || got.State != store.StateForwarding {
		t.Errorf("after reopens: %s lease %+v; want the first open's lease kept as stored", got.State, got.Lease)
	}
	recs := claimAt(t, b, t0, 10)
	if len(recs) != 1 || recs[0].LastError != store.LapseRestart || recs[0].Interrupts != 1 {
		t.Errorf("claim after reopens = %+v; want a, lapsed by restart", recs)
	}
	checkIndexesOK(t, b)
}

// TestBadgerRetentionTTL: Badger forgets a record at its ExpiresAt by TTL
// (records stored here expire in the past: no waiting). An expired record
// no longer deduplicates, and when one is stored again under the key, the
// expiry watch of the first does not make Expire report the key twice or
// at the first's time.
func TestBadgerRetentionTTL(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	wall := time.Now().UTC()
	first := testRecord("a", store.StateFailed)
	first.ExpiresAt = wall.Add(-2 * time.Minute)
	mustInsert(t, b, first)
	if r, err := b.Get(ctx, key("a")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get of an expired record = %+v, %v; want ErrNotFound", r, err)
	}
	if got := recIDs(claimAt(t, b, t0, 10, key("a"))); got != "" {
		t.Errorf("claim by key of an expired record = %q", got)
	}
	if got := recIDs(claimAt(t, b, t0, 10)); got != "" {
		t.Errorf("claim of an expired due record = %q", got)
	}

	second := testRecord("a", store.StateParked)
	second.ExpiresAt = wall.Add(-time.Minute)
	if res, err := b.Insert(ctx, second); err != nil || res.Existing != nil {
		t.Fatalf("Insert over an expired record = %+v, %v; want it stored", res, err)
	}
	gone, err := b.Expire(ctx, wall, 10)
	if err != nil || len(gone) != 1 || gone[0].Key != key("a") || gone[0].State != store.StateParked {
		t.Errorf("Expire = %+v, %v; want a, parked, once", gone, err)
	}
	if gone, err := b.Expire(ctx, wall.Add(time.Hour), 10); err != nil || len(gone) != 0 {
		t.Errorf("second Expire = %+v, %v; want none", gone, err)
	}

	mustInsert(t, b, testRecord("a", store.StateQueued))
	mustGet(t, b, key("a"))
	if gone, err := b.Expire(ctx, wall, 10); err != nil || len(gone) != 0 {
		t.Errorf("Expire after a live record was stored = %+v, %v; want none", gone, err)
	}
	checkIndexesOK(t, b)
}

// BenchmarkInsertParallel measures durable (SyncWrites) inserts of distinct
// keys from 16 goroutines per CPU; commits/op shows what share of a group
// commit one insert costs.
func BenchmarkInsertParallel(b *testing.B) {
	s := openTestBadger(b, Options{Dir: b.TempDir()})
	var next atomic.Int64
	before := s.Commits()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Insert(ctx, testRecord(fmt.Sprint(next.Add(1)), store.StateForwarding)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(s.Commits()-before)/float64(b.N), "commits/op")
}

// TestBadgerReadsSnappyTables: the store writes its tables uncompressed
// and runs without a block cache, but a store whose tables an earlier
// version wrote with Snappy (Badger's default) opens, counts and reads
// as before.
func TestBadgerReadsSnappyTables(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	const n = 300
	for i := range n {
		st := store.StateDelivered
		if i%3 == 0 {
			st = store.StateParked
		}
		mustInsert(t, b, testRecord(fmt.Sprintf("s%03d", i), st))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Every entry written again by Badger with its default options
	// (Snappy), so that the tables the next open reads are compressed.
	rewrite := func(db badgerDB) error {
		type kv struct {
			k, v []byte
			exp  uint64
		}
		var all []kv
		if err := db.View(func(txn *badger.Txn) error {
			return eachEntry(txn, func(k, v []byte, expiresAt uint64) { all = append(all, kv{k, v, expiresAt}) })
		}); err != nil {
			return err
		}
		return db.Update(func(txn *badger.Txn) error {
			for _, x := range all {
				e := badger.NewEntry(x.k, x.v)
				e.ExpiresAt = x.exp
				if err := txn.SetEntry(e); err != nil {
					return err
				}
			}
			return nil
		})
	}
	db, err := openManaged(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := rewrite(db); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = openManaged(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	compressed := false
	for _, ti := range db.Tables() {
		compressed = compressed || ti.OnDiskSize < ti.UncompressedSize
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if !compressed {
		t.Fatal("no compressed table to read: the test would prove nothing")
	}

	b = openTestBadger(t, Options{Dir: dir})
	checkIndexesOK(t, b)
	c, err := b.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (map[store.State]int64{store.StateDelivered: n - n/3, store.StateParked: n / 3}); !maps.Equal(c.Records["captchaai"], want) {
		t.Errorf("counts %v, want %v", c.Records["captchaai"], want)
	}
	for i := range n {
		if r := mustGet(t, b, key(fmt.Sprintf("s%03d", i))); r.Code != fmt.Sprintf("CODE-s%03d", i) || string(r.Request.Body) != "id="+r.ID+"&code="+r.Code {
			t.Fatalf("record %s read back as %+v", r.ID, r)
		}
	}
	parked, err := b.List(ctx, store.Filter{State: store.StateParked}, 1000)
	if err != nil || len(parked) != n/3 {
		t.Errorf("List(parked) = %d records, %v; want %d", len(parked), err, n/3)
	}
}
