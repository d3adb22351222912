package store

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// openTestBadger opens a Badger store on disk in dir and closes it at test
// end (Close is idempotent, so tests may close it earlier).
func openTestBadger(t testing.TB, dir string) *Badger {
	t.Helper()
	b, err := OpenBadger(BadgerOptions{Dir: dir})
	if err != nil {
		t.Fatalf("opening badger in %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing badger: %v", err)
		}
	})
	return b
}

// t0 is a fixed, whole-second base time for records.
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// testRecord is a stored-then-forwarding record received at t0 that
// expires long after the test.
func testRecord(id, code string) *Record {
	return &Record{
		Provider:   "captchaai",
		ID:         id,
		Code:       code,
		Source:     "callback",
		ReceivedAt: t0,
		Server:     "srv0",
		Request: Request{
			Method:     http.MethodPost,
			URI:        "/cb?id=" + id,
			Host:       "example.com",
			Proto:      "HTTP/1.1",
			RemoteAddr: "192.0.2.1:4242",
			Header:     http.Header{"Content-Type": {"application/x-www-form-urlencoded"}},
			Body:       []byte("id=" + id + "&code=" + code),
		},
		State:     StateForwarding,
		Attempts:  1,
		DueAt:     t0.Add(time.Minute),
		UpdatedAt: t0,
		ExpiresAt: time.Now().Add(24 * time.Hour).Truncate(time.Second).UTC(),
	}
}

func key(id string) Key { return Key{Provider: "captchaai", ID: id} }

// dueIDs returns the ids Due reports at now, in order.
func dueIDs(t *testing.T, b *Badger, now time.Time, limit int) []string {
	t.Helper()
	recs, err := b.Due(context.Background(), now, limit)
	if err != nil {
		t.Fatalf("due: %v", err)
	}
	ids := make([]string, 0, len(recs))
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}

func TestBadgerInsertThenGet(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	rec := testRecord("1001", "03AGdBq24")
	rec.Request.Body = []byte{0, 1, 2, 0xff, '\n'} // bodies are bytes, not text
	rec.Request.Header.Add("X-Forwarded-For", "198.51.100.7")

	existing, err := b.Insert(ctx, rec)
	if err != nil || existing != nil {
		t.Fatalf("insert: got (%v, %v), want (nil, nil)", existing, err)
	}
	got, err := b.Get(ctx, rec.Key())
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	switch {
	case got.Provider != rec.Provider || got.ID != rec.ID || got.Code != rec.Code:
		t.Errorf("got %s:%s code %q, want %s:%s code %q", got.Provider, got.ID, got.Code, rec.Provider, rec.ID, rec.Code)
	case got.State != StateForwarding || got.Attempts != 1 || got.Source != "callback" || got.Server != "srv0":
		t.Errorf("got state %q attempts %d source %q server %q", got.State, got.Attempts, got.Source, got.Server)
	case !got.ReceivedAt.Equal(rec.ReceivedAt) || !got.DueAt.Equal(rec.DueAt) || !got.ExpiresAt.Equal(rec.ExpiresAt):
		t.Errorf("times changed: got received %s due %s expires %s", got.ReceivedAt, got.DueAt, got.ExpiresAt)
	case string(got.Request.Body) != string(rec.Request.Body):
		t.Errorf("body: got %q, want %q", got.Request.Body, rec.Request.Body)
	case got.Request.Method != http.MethodPost || got.Request.URI != rec.Request.URI || got.Request.Host != "example.com" || got.Request.RemoteAddr != rec.Request.RemoteAddr:
		t.Errorf("request line: got %+v", got.Request)
	case !slices.Equal(got.Request.Header.Values("X-Forwarded-For"), []string{"198.51.100.7"}) ||
		got.Request.Header.Get("Content-Type") != "application/x-www-form-urlencoded":
		t.Errorf("headers: got %v", got.Request.Header)
	}
}

func TestBadgerInsertExistingKeepsFirst(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	if _, err := b.Insert(ctx, testRecord("7", "FIRST")); err != nil {
		t.Fatal(err)
	}
	second := testRecord("7", "SECOND")
	second.DueAt = t0.Add(-time.Hour)
	existing, err := b.Insert(ctx, second)
	if err != nil {
		t.Fatalf("second insert: %v", err)
	}
	if existing == nil || existing.Code != "FIRST" {
		t.Fatalf("second insert: got existing %+v, want the first record", existing)
	}
	got, err := b.Get(ctx, key("7"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Code != "FIRST" || !got.DueAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("record was overwritten: code %q due %s", got.Code, got.DueAt)
	}
	// The refused record left no due index entry behind.
	if ids := dueIDs(t, b, t0, 10); len(ids) != 0 {
		t.Errorf("due at t0: got %v, want none", ids)
	}
}

func TestBadgerUpdateMovesDueIndex(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	// Inserted out of due order: Due must sort by DueAt, not insertion.
	for _, x := range []struct {
		id  string
		due time.Duration
	}{{"3", 3 * time.Second}, {"1", time.Second}, {"2", 2 * time.Second}} {
		rec := testRecord(x.id, "C"+x.id)
		rec.DueAt = t0.Add(x.due)
		if _, err := b.Insert(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	check := func(now time.Duration, limit int, want ...string) {
		t.Helper()
		if got := dueIDs(t, b, t0.Add(now), limit); !slices.Equal(got, want) {
			t.Errorf("due at t0+%s limit %d: got %v, want %v", now, limit, got, want)
		}
	}
	check(0, 10)
	check(time.Second, 10, "1") // at DueAt exactly: due
	check(2*time.Second, 10, "1", "2")
	check(time.Hour, 10, "1", "2", "3")
	check(time.Hour, 2, "1", "2")

	// A failed forward: new state, attempts and a later due time.
	rec, err := b.Update(ctx, key("1"), func(r *Record) error {
		r.State = StateFailed
		r.Attempts = 2
		r.LastStatus = http.StatusBadGateway
		r.LastError = "app down"
		r.DueAt = t0.Add(5 * time.Second)
		return nil
	})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if rec.State != StateFailed || rec.Attempts != 2 || !rec.DueAt.Equal(t0.Add(5*time.Second)) {
		t.Errorf("update returned %+v", rec)
	}
	got, err := b.Get(ctx, key("1"))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateFailed || got.Attempts != 2 || got.LastStatus != http.StatusBadGateway || got.LastError != "app down" || got.Code != "C1" {
		t.Errorf("get after update: %+v", got)
	}
	check(2*time.Second, 10, "2") // moved away from its old slot
	check(time.Hour, 10, "2", "3", "1")

	// Delivered: no due time, so it leaves the index.
	if _, err := b.Update(ctx, key("2"), func(r *Record) error {
		r.State = StateDelivered
		r.DueAt = time.Time{}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check(time.Hour, 10, "3", "1")
	if got, err := b.Get(ctx, key("2")); err != nil || got.State != StateDelivered {
		t.Errorf("delivered record: got %+v, %v", got, err)
	}
}

func TestBadgerUpdateFnErrorChangesNothing(t *testing.T) {
	for _, fnErr := range []error{errors.New("not this attempt"), ErrSkip} {
		t.Run(fnErr.Error(), func(t *testing.T) {
			b := openTestBadger(t, t.TempDir())
			ctx := context.Background()
			if _, err := b.Insert(ctx, testRecord("5", "KEEP")); err != nil {
				t.Fatal(err)
			}
			rec, err := b.Update(ctx, key("5"), func(r *Record) error {
				r.Code = "CHANGED"
				r.State = StateDelivered
				r.DueAt = time.Time{}
				return fnErr
			})
			if !errors.Is(err, fnErr) {
				t.Fatalf("update: got error %v, want %v", err, fnErr)
			}
			if rec == nil || rec.Code != "KEEP" || rec.State != StateForwarding {
				t.Errorf("update returned %+v, want the unchanged record", rec)
			}
			got, err := b.Get(ctx, key("5"))
			if err != nil {
				t.Fatal(err)
			}
			if got.Code != "KEEP" || got.State != StateForwarding {
				t.Errorf("record changed: %+v", got)
			}
			if ids := dueIDs(t, b, t0.Add(time.Hour), 10); !slices.Equal(ids, []string{"5"}) {
				t.Errorf("due: got %v, want [5]", ids)
			}
		})
	}
}

func TestBadgerNotFound(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	if _, err := b.Get(ctx, key("404")); !errors.Is(err, ErrNotFound) {
		t.Errorf("get: got %v, want ErrNotFound", err)
	}
	called := false
	rec, err := b.Update(ctx, key("404"), func(*Record) error { called = true; return nil })
	if !errors.Is(err, ErrNotFound) || rec != nil {
		t.Errorf("update: got (%v, %v), want (nil, ErrNotFound)", rec, err)
	}
	if called {
		t.Error("update called fn for a missing record")
	}
	// Same id, other provider: a different key.
	if _, err := b.Insert(ctx, testRecord("404", "X")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, Key{Provider: "2captcha", ID: "404"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("get under another provider: got %v, want ErrNotFound", err)
	}
}

func TestBadgerReopenKeepsData(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	b := openTestBadger(t, dir)
	for _, id := range []string{"1", "2"} {
		if _, err := b.Insert(ctx, testRecord(id, "C"+id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Update(ctx, key("2"), func(r *Record) error {
		r.State = StateFailed
		r.Attempts = 3
		r.DueAt = t0.Add(-time.Second)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	b2 := openTestBadger(t, dir)
	got, err := b2.Get(ctx, key("2"))
	if err != nil {
		t.Fatalf("get after reopen: %v", err)
	}
	if got.Code != "C2" || got.State != StateFailed || got.Attempts != 3 {
		t.Errorf("after reopen: %+v", got)
	}
	if ids := dueIDs(t, b2, t0.Add(time.Hour), 10); !slices.Equal(ids, []string{"2", "1"}) {
		t.Errorf("due after reopen: got %v, want [2 1]", ids)
	}
	// Dedupe survives the restart too.
	existing, err := b2.Insert(ctx, testRecord("1", "OTHER"))
	if err != nil || existing == nil || existing.Code != "C1" {
		t.Errorf("insert after reopen: got (%+v, %v), want the stored record", existing, err)
	}
}

func TestBadgerClosed(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	if _, err := b.Insert(ctx, testRecord("1", "C")); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, err := b.Insert(ctx, testRecord("2", "C")); !errors.Is(err, ErrClosed) {
		t.Errorf("insert: got %v, want ErrClosed", err)
	}
	if _, err := b.Get(ctx, key("1")); !errors.Is(err, ErrClosed) {
		t.Errorf("get: got %v, want ErrClosed", err)
	}
	if _, err := b.Update(ctx, key("1"), func(*Record) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("update: got %v, want ErrClosed", err)
	}
	if _, err := b.Due(ctx, t0.Add(time.Hour), 10); !errors.Is(err, ErrClosed) {
		t.Errorf("due: got %v, want ErrClosed", err)
	}
}

func TestBadgerRetention(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	old := testRecord("9", "OLD")
	old.ExpiresAt = time.Now().Add(-time.Minute).UTC()
	if _, err := b.Insert(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Get(ctx, key("9")); !errors.Is(err, ErrNotFound) {
		t.Errorf("get expired: got %v, want ErrNotFound", err)
	}
	if ids := dueIDs(t, b, t0.Add(time.Hour), 10); len(ids) != 0 {
		t.Errorf("due: got %v, want none (expired)", ids)
	}
	if _, err := b.Update(ctx, key("9"), func(*Record) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Errorf("update expired: got %v, want ErrNotFound", err)
	}
	// An expired record no longer deduplicates.
	existing, err := b.Insert(ctx, testRecord("9", "NEW"))
	if err != nil || existing != nil {
		t.Fatalf("insert over expired: got (%+v, %v), want (nil, nil)", existing, err)
	}
	if got, err := b.Get(ctx, key("9")); err != nil || got.Code != "NEW" {
		t.Errorf("get: got (%+v, %v), want code NEW", got, err)
	}
}

// insertConcurrently inserts n records of distinct keys from n goroutines
// released at once and returns how many commits they took.
func insertConcurrently(t *testing.T, b *Badger, n int) uint64 {
	t.Helper()
	ctx := context.Background()
	before := b.Commits()
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			existing, err := b.Insert(ctx, testRecord(fmt.Sprint(1000+i), fmt.Sprint("C", i)))
			if err == nil && existing != nil {
				err = fmt.Errorf("insert %d: unexpected existing record %s", i, existing.ID)
			}
			errs <- err
		}()
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
		got, err := b.Get(ctx, key(fmt.Sprint(1000+i)))
		if err != nil || got.Code != fmt.Sprint("C", i) {
			t.Fatalf("get %d: got (%+v, %v)", 1000+i, got, err)
		}
	}
	if ids := dueIDs(t, b, t0.Add(time.Hour), 10*n); len(ids) != n {
		t.Errorf("due: got %d records, want %d", len(ids), n)
	}
	return b.Commits() - before
}

func TestBadgerGroupCommit(t *testing.T) {
	const n = 200
	b := openTestBadger(t, t.TempDir())
	commits := insertConcurrently(t, b, n)
	t.Logf("%d concurrent inserts in %d commits", n, commits)
	if commits == 0 || commits >= n {
		t.Errorf("%d concurrent inserts took %d commits; want fewer commits than inserts (group commit)", n, commits)
	}

	// The control: with batches of one, every insert is its own commit,
	// so the counter above counts transactions, not something else.
	one, err := OpenBadger(BadgerOptions{Dir: t.TempDir(), MaxBatch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	if commits := insertConcurrently(t, one, 50); commits != 50 {
		t.Errorf("MaxBatch 1: 50 inserts took %d commits, want 50", commits)
	}
}

func TestBadgerConcurrentInsertOneKey(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	const n = 50
	type result struct {
		code     string
		existing *Record
		err      error
	}
	start := make(chan struct{})
	results := make(chan result, n)
	for i := range n {
		go func() {
			<-start
			code := fmt.Sprint("C", i)
			existing, err := b.Insert(ctx, testRecord("77", code))
			results <- result{code, existing, err}
		}()
	}
	close(start)
	var winners []string
	var losers []*Record
	for range n {
		r := <-results
		switch {
		case r.err != nil:
			t.Fatalf("insert %s: %v", r.code, r.err)
		case r.existing == nil:
			winners = append(winners, r.code)
		default:
			losers = append(losers, r.existing)
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
	got, err := b.Get(ctx, key("77"))
	if err != nil || got.Code != winners[0] {
		t.Errorf("get: got (%+v, %v), want code %q", got, err, winners[0])
	}
}

// BenchmarkInsertParallel measures durable (SyncWrites) inserts of distinct
// keys from 16 goroutines per CPU (32 on two cores, like the 32 concurrent
// clients of BENCHMARKS.md); the commits/op figure shows what share of a
// group commit one insert costs.
func BenchmarkInsertParallel(b *testing.B) {
	s := openTestBadger(b, b.TempDir())
	ctx := context.Background()
	var next atomic.Int64
	before := s.Commits()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			rec := testRecord(fmt.Sprint(next.Add(1)), "03AGdBq24")
			if _, err := s.Insert(ctx, rec); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(s.Commits()-before)/float64(b.N), "commits/op")
}

func TestBadgerList(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	for i, st := range []State{StateParked, StateDelivered, StateParked, StateRejected} {
		r := testRecord(fmt.Sprintf("%d", 10+i), "c")
		r.State = st
		if i == 3 {
			r.Provider = "2captcha"
		}
		if _, err := b.Insert(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(f Filter, limit int) string {
		t.Helper()
		recs, err := b.List(ctx, f, limit)
		if err != nil {
			t.Fatalf("List(%+v): %v", f, err)
		}
		var out []string
		for _, r := range recs {
			out = append(out, r.Provider+":"+r.ID)
		}
		return strings.Join(out, ",")
	}
	tests := []struct {
		f     Filter
		limit int
		want  string
	}{
		{Filter{}, 10, "2captcha:13,captchaai:10,captchaai:11,captchaai:12"},
		{Filter{State: StateParked}, 10, "captchaai:10,captchaai:12"},
		{Filter{State: StateParked}, 1, "captchaai:10"},
		{Filter{Provider: "2captcha"}, 10, "2captcha:13"},
		{Filter{Provider: "captchaai", State: StateRejected}, 10, ""},
		{Filter{Provider: "rucaptcha"}, 10, ""},
	}
	for _, tc := range tests {
		if got := ids(tc.f, tc.limit); got != tc.want {
			t.Errorf("List(%+v, %d) = %q, want %q", tc.f, tc.limit, got, tc.want)
		}
	}
}

func TestBadgerUpdateDelivery(t *testing.T) {
	b := openTestBadger(t, t.TempDir())
	ctx := context.Background()
	r := testRecord("20", "CODE")
	if _, err := b.Insert(ctx, r); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(time.Hour)
	d, err := b.UpdateDelivery(ctx, key("20"), func(d *Delivery) error {
		if d.State != StateForwarding || d.Attempts != 1 || !d.DueAt.Equal(t0.Add(time.Minute)) {
			t.Errorf("fn saw %+v, want the inserted delivery state", *d)
		}
		d.State, d.Attempts, d.DueAt, d.LastStatus, d.LastError = StateFailed, 2, later, 503, "app answered 503"
		return nil
	})
	if err != nil || d.State != StateFailed || d.Attempts != 2 {
		t.Fatalf("UpdateDelivery = %+v, %v", d, err)
	}
	got, err := b.Get(ctx, key("20"))
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateFailed || got.Attempts != 2 || !got.DueAt.Equal(later) || got.LastStatus != 503 ||
		got.Code != "CODE" || string(got.Request.Body) != string(r.Request.Body) {
		t.Errorf("Get after UpdateDelivery = %+v", got)
	}
	if ids := dueIDs(t, b, t0.Add(30*time.Minute), 10); len(ids) != 0 {
		t.Errorf("due before the new DueAt: %v, want none (the old index entry must be gone)", ids)
	}
	if ids := dueIDs(t, b, later, 10); !slices.Equal(ids, []string{"20"}) {
		t.Errorf("due at the new DueAt: %v, want [20]", ids)
	}
	if recs, err := b.List(ctx, Filter{State: StateFailed}, 10); err != nil || len(recs) != 1 || recs[0].Attempts != 2 {
		t.Errorf("List(failed) = %+v, %v; want the updated record", recs, err)
	}

	_, err = b.UpdateDelivery(ctx, key("20"), func(d *Delivery) error { d.Attempts = 99; return ErrSkip })
	if !errors.Is(err, ErrSkip) {
		t.Errorf("skip: err = %v", err)
	}
	if got, _ := b.Get(ctx, key("20")); got.Attempts != 2 {
		t.Errorf("after a skipped update attempts = %d, want 2", got.Attempts)
	}
	if _, err := b.UpdateDelivery(ctx, key("404"), func(*Delivery) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown key: err = %v, want ErrNotFound", err)
	}
}
