package storetest

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

func testInsertThenGet(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	rec := newRecord("1001", t0.Add(123456789*time.Nanosecond), store.Delivery{
		State:      store.StateFailed,
		Attempts:   2,
		Failures:   2,
		Interrupts: 1,
		DueAt:      t0.Add(90*time.Second + 5*time.Nanosecond),
		LastStatus: http.StatusBadGateway,
		LastError:  "app answered 502",
		UpdatedAt:  t0.Add(time.Second + 7*time.Nanosecond),
	})
	rec.Source = store.SourcePoll
	rec.SubmittedAt = t0.Add(-time.Minute)
	rec.Request.Body = []byte{0, 1, 2, 0xff, '\n', 0x80, '=', '&'} // bytes, not text
	rec.Request.Header.Add("X-Forwarded-For", "198.51.100.7")
	rec.Request.Header.Add("X-Forwarded-For", "203.0.113.9")
	rec.Request.Header.Set("User-Agent", "2captcha-pingback/1.0")
	want := cloneRecord(rec)

	res, err := s.Insert(ctx, rec)
	if err != nil {
		t.Fatalf("Insert: %v", err)
	}
	if res.Existing != nil || !res.SubmittedAt.IsZero() {
		t.Errorf("Insert of a new, untracked record = %+v; want no existing record and no submission time", res)
	}
	if !reflect.DeepEqual(rec, want) {
		t.Errorf("Insert changed its argument:\n got %+v\nwant %+v", rec, want)
	}
	if d := diffRecord(get(t, s, "1001"), want); d != "" {
		t.Errorf("Get after Insert: %s", d)
	}
	// The key is provider and id: neither alone finds the record.
	if r, err := s.Get(ctx, store.Key{Provider: "rucaptcha", ID: "1001"}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get under another provider = %+v, %v; want ErrNotFound", r, err)
	}
	wantNotFound(t, s, "100")
	wantNotFound(t, s, "10011")

	// A second record does not disturb the first.
	insert(t, s, queued("1002", t0, t0))
	if d := diffRecord(get(t, s, "1001"), want); d != "" {
		t.Errorf("Get after another Insert: %s", d)
	}
}

func testInsertDuplicate(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	first := queued("7", t0, t0.Add(time.Hour))
	insert(t, s, first)

	second := queued("7", t0.Add(time.Second), t0) // due earlier
	second.Code = "SECOND"
	second.Request.Body = []byte("second")
	arg := cloneRecord(second)
	res, err := s.Insert(ctx, second)
	if err != nil {
		t.Fatalf("duplicate Insert: %v", err)
	}
	if res.Existing == nil {
		t.Fatal("duplicate Insert: no Existing record")
	}
	if d := diffRecord(res.Existing, first); d != "" {
		t.Errorf("duplicate Insert's Existing: %s", d)
	}
	if !reflect.DeepEqual(second, arg) {
		t.Errorf("duplicate Insert changed its argument")
	}
	if d := diffRecord(get(t, s, "7"), first); d != "" {
		t.Errorf("Get after a duplicate Insert (it must write nothing): %s", d)
	}
	// The duplicate's earlier due time was not indexed either.
	wantIDs(t, "claim at the duplicate's due time", h.claim(t, s, t0.Add(30*time.Minute), 10))

	// Existing carries the current delivery state, not the one inserted.
	update(t, s, "7", func(d *store.Delivery) {
		d.State, d.Attempts, d.Failures, d.LastStatus, d.DueAt = store.StateFailed, 1, 1, 503, t0.Add(2*time.Hour)
	})
	res, err = s.Insert(ctx, second)
	if err != nil || res.Existing == nil {
		t.Fatalf("duplicate Insert after an update = %+v, %v", res, err)
	}
	if res.Existing.State != store.StateFailed || res.Existing.LastStatus != 503 || res.Existing.Code != first.Code {
		t.Errorf("duplicate Insert after an update: Existing is %s/%d code %q; want the current state (failed, 503) of the first record",
			res.Existing.State, res.Existing.LastStatus, res.Existing.Code)
	}
	wantIDs(t, "claim at the failed record's due time", h.claim(t, s, t0.Add(2*time.Hour), 10), "7")
}

func testInsertForwarding(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	rec := newRecord("1", t0, store.Delivery{
		State:     store.StateForwarding,
		Attempts:  1,
		Lease:     store.Lease{Owner: "someone else", Until: t0.Add(time.Hour)},
		UpdatedAt: t0,
	})
	arg := cloneRecord(rec)
	insert(t, s, rec)
	if !reflect.DeepEqual(rec, arg) {
		t.Errorf("Insert changed its argument: lease now %+v", rec.Lease)
	}
	got := get(t, s, "1")
	if got.State != store.StateForwarding || got.Lease.Owner != s.Owner() || !got.Lease.Until.Equal(t0.Add(time.Hour)) {
		t.Errorf("stored forwarding record: state %s lease %+v; want the lease {%s %s}", got.State, got.Lease, s.Owner(), fmtTime(t0.Add(time.Hour)))
	}
	// Its lease holds: neither a claim nor a claim by key takes it.
	wantIDs(t, "claim of a record under a live lease", h.claim(t, s, t0.Add(time.Minute), 10))
	wantIDs(t, "claim by key of a record under a live lease", h.claimKeys(t, s, t0.Add(time.Minute), "1"))

	// Any other state is stored without a lease, whatever the caller says.
	other := inState("2", t0, store.StateQueued)
	other.Lease = store.Lease{Owner: s.Owner(), Until: t0.Add(time.Hour)}
	insert(t, s, other)
	if got := get(t, s, "2"); got.Lease != (store.Lease{}) {
		t.Errorf("a queued record was stored with lease %+v; want none", got.Lease)
	}
}

func testInsertCompletesTask(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	sub := t0.Add(-2 * time.Minute)
	task := newTask("55", sub, t0.Add(time.Minute))
	if ex, err := s.AddTask(ctx, task); err != nil || ex != nil {
		t.Fatalf("AddTask = %+v, %v", ex, err)
	}
	rec := inState("55", t0, store.StateForwarding)
	res, err := s.Insert(ctx, rec)
	if err != nil || res.Existing != nil {
		t.Fatalf("Insert = %+v, %v", res, err)
	}
	if !res.SubmittedAt.Equal(sub) {
		t.Errorf("InsertResult.SubmittedAt = %s, want the task's %s", fmtTime(res.SubmittedAt), fmtTime(sub))
	}
	if !rec.SubmittedAt.IsZero() {
		t.Errorf("Insert set its argument's SubmittedAt")
	}
	if got := get(t, s, "55"); !got.SubmittedAt.Equal(sub) || !got.Tracked {
		t.Errorf("stored record's SubmittedAt = %s tracked %v, want %s, tracked", fmtTime(got.SubmittedAt), got.Tracked, fmtTime(sub))
	}
	gt, err := s.GetTask(ctx, key("55"))
	if err != nil {
		t.Fatal(err)
	}
	if gt.State != store.TaskDone || !gt.NextPollAt.IsZero() {
		t.Errorf("task after its result was stored: state %s next poll %s; want done, never polled", gt.State, fmtTime(gt.NextPollAt))
	}
	if !gt.ResultAt.Equal(rec.ReceivedAt) {
		t.Errorf("task's ResultAt = %s, want its result's ReceivedAt %s", fmtTime(gt.ResultAt), fmtTime(rec.ReceivedAt))
	}
	if got := dueTaskIDs(t, s, t0.Add(time.Hour), 10); len(got) != 0 {
		t.Errorf("DueTasks after the result was stored = %v, want none", got)
	}
	// A result of an untracked task has no submission time.
	res, err = s.Insert(ctx, inState("56", t0, store.StateForwarding))
	if err != nil || !res.SubmittedAt.IsZero() {
		t.Errorf("Insert of an untracked result = %+v, %v; want no submission time", res, err)
	}
	if _, err := s.GetTask(ctx, key("56")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Insert of an untracked result created a task: %v", err)
	}
}

func testInsertTooLarge(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	big := queued("big", t0, t0)
	big.Request.Body = bytes.Repeat([]byte{0xa5}, store.MaxRecordSize)
	res, err := s.Insert(ctx, big)
	if !errors.Is(err, store.ErrTooLarge) {
		t.Fatalf("Insert of a %d-byte body = %+v, %v; want ErrTooLarge", len(big.Request.Body), res, err)
	}
	wantNotFound(t, s, "big")

	// The largest body the handler lets through, with a fair set of
	// headers, is stored and reads back byte for byte.
	largest := queued("max", t0, t0)
	largest.Request.Body = bytes.Repeat([]byte("\x00\xffid=1&code=03AGdBq24"), store.MaxBodySize/20+1)[:store.MaxBodySize]
	for i := range 40 {
		largest.Request.Header.Add("X-Header-"+strings.Repeat("x", i), strings.Repeat("v", 100))
	}
	insert(t, s, largest)
	if d := diffRecord(get(t, s, "max"), largest); d != "" {
		t.Errorf("Get of a record with a MaxBodySize body: %s", d)
	}
	recs := h.claim(t, s, t0, 1)
	wantIDs(t, "claim of the large record", recs, "max")
	if len(recs) == 1 && !bytes.Equal(recs[0].Request.Body, largest.Request.Body) {
		t.Errorf("claimed large record has a body of %d bytes, want the stored %d", len(recs[0].Request.Body), len(largest.Request.Body))
	}
}

func testUpdateDelivery(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	rec := queued("20", t0, t0.Add(time.Second))
	insert(t, s, rec)

	later := t0.Add(time.Hour)
	var saw store.Delivery
	d := update(t, s, "20", func(d *store.Delivery) {
		saw = *d
		d.State, d.Attempts, d.Failures, d.DueAt = store.StateFailed, 1, 1, later
		d.LastStatus, d.LastError, d.UpdatedAt = 503, "app answered 503", t0.Add(time.Second)
	})
	if dd := diffDelivery(saw, rec.Delivery); dd != "" {
		t.Errorf("fn saw %s", dd)
	}
	want := rec.Delivery
	want.State, want.Attempts, want.Failures, want.DueAt = store.StateFailed, 1, 1, later
	want.LastStatus, want.LastError, want.UpdatedAt = 503, "app answered 503", t0.Add(time.Second)
	if dd := diffDelivery(d, want); dd != "" {
		t.Errorf("UpdateDelivery returned %s", dd)
	}
	wantRec := cloneRecord(rec)
	wantRec.Delivery = want
	if dd := diffRecord(get(t, s, "20"), wantRec); dd != "" {
		t.Errorf("Get after UpdateDelivery (the request is kept): %s", dd)
	}
	// The due index moved: not due at the old time, due at the new one.
	wantIDs(t, "claim between the old and the new due time", h.claim(t, s, later.Add(-time.Nanosecond), 10))
	if recs, err := s.List(ctx, store.Filter{State: store.StateFailed}, 10); err != nil || len(recs) != 1 || recs[0].LastStatus != 503 {
		t.Errorf("List(failed) = %v, %v; want the updated record", ids(recs), err)
	}
	// Delivered: never claimed again.
	update(t, s, "20", func(d *store.Delivery) {
		d.State, d.DueAt, d.LastStatus, d.LastError = store.StateDelivered, time.Time{}, 200, ""
	})
	wantIDs(t, "claim of a delivered record", h.claim(t, s, later.Add(time.Hour), 10))

	called := false
	if _, err := s.UpdateDelivery(ctx, key("404"), func(*store.Delivery) error { called = true; return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateDelivery of an unknown key: %v, want ErrNotFound", err)
	}
	if called {
		t.Error("UpdateDelivery called fn for an unknown key")
	}
}

func testUpdateDeliveryFnError(t *testing.T, h Harness) {
	for _, fnErr := range []error{errors.New("not this attempt"), store.ErrSkip} {
		t.Run(fnErr.Error(), func(t *testing.T) {
			s := h.Open(t)
			t0 := base()
			rec := queued("5", t0, t0.Add(time.Minute))
			insert(t, s, rec)
			d, err := s.UpdateDelivery(ctx, key("5"), func(d *store.Delivery) error {
				d.State, d.Attempts, d.DueAt, d.LastError = store.StateFailed, 9, t0, "changed"
				return fnErr
			})
			if !errors.Is(err, fnErr) {
				t.Fatalf("UpdateDelivery: error %v, want %v", err, fnErr)
			}
			if dd := diffDelivery(d, rec.Delivery); dd != "" {
				t.Errorf("UpdateDelivery returned a changed state: %s", dd)
			}
			if dd := diffRecord(get(t, s, "5"), rec); dd != "" {
				t.Errorf("record changed: %s", dd)
			}
			wantIDs(t, "claim at fn's due time", h.claim(t, s, t0.Add(time.Second), 10))
			wantIDs(t, "claim at the stored due time", h.claim(t, s, t0.Add(time.Minute), 10), "5")
		})
	}
}

func testUpdateDeliveryLeaseInvariant(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	until := t0.Add(time.Hour)
	tests := []struct {
		name      string
		from      store.State
		fn        func(d *store.Delivery)
		wantLease store.Lease
	}{
		{"forwarding to failed keeps no lease", store.StateForwarding, func(d *store.Delivery) {
			d.State, d.DueAt = store.StateFailed, t0.Add(time.Minute)
		}, store.Lease{}},
		{"forwarding to delivered keeps no lease", store.StateForwarding, func(d *store.Delivery) {
			d.State = store.StateDelivered
		}, store.Lease{}},
		{"parked with a lease is stored without", store.StateParked, func(d *store.Delivery) {
			d.Lease = store.Lease{Owner: "x", Until: until}
		}, store.Lease{}},
		{"forwarding without an owner is leased to this handle", store.StateQueued, func(d *store.Delivery) {
			d.State, d.Attempts, d.Lease = store.StateForwarding, d.Attempts+1, store.Lease{Until: until}
		}, store.Lease{Owner: "$self", Until: until}},
		{"a forwarding lease renewed by hand keeps its owner", store.StateForwarding, func(d *store.Delivery) {
			d.Lease.Until = until
		}, store.Lease{Owner: "$self", Until: until}},
	}
	for i, tc := range tests {
		id := string(rune('a' + i))
		insert(t, s, inState(id, t0, tc.from))
		d := update(t, s, id, tc.fn)
		want := tc.wantLease
		if want.Owner == "$self" {
			want.Owner = s.Owner()
		}
		for _, x := range []struct {
			what string
			d    store.Delivery
		}{{"returned", d}, {"stored", get(t, s, id).Delivery}} {
			if x.d.Lease.Owner != want.Owner || !x.d.Lease.Until.Equal(want.Until) {
				t.Errorf("%s: %s lease %+v, want %+v", tc.name, x.what, x.d.Lease, want)
			}
			if x.d.State == store.StateForwarding && !x.d.DueAt.IsZero() {
				t.Errorf("%s: %s forwarding state with due time %s", tc.name, x.what, fmtTime(x.d.DueAt))
			}
		}
	}
}

func testList(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	for i, st := range []store.State{store.StateParked, store.StateDelivered, store.StateParked, store.StateRejected, store.StateFailed} {
		r := inState(string(rune('a'+i)), t0, st)
		if i == 3 {
			r.Provider = "rucaptcha"
		}
		insert(t, s, r)
	}
	// List shows the current state.
	update(t, s, "e", func(d *store.Delivery) { d.State, d.DueAt = store.StateDelivered, time.Time{} })
	tests := []struct {
		f     store.Filter
		limit int
		want  string
	}{
		{store.Filter{}, 10, "2captcha:a,2captcha:b,2captcha:c,2captcha:e,rucaptcha:d"},
		{store.Filter{}, 2, "2captcha:a,2captcha:b"},
		{store.Filter{State: store.StateParked}, 10, "2captcha:a,2captcha:c"},
		{store.Filter{State: store.StateParked}, 1, "2captcha:a"},
		{store.Filter{State: store.StateDelivered}, 10, "2captcha:b,2captcha:e"},
		{store.Filter{Provider: "rucaptcha"}, 10, "rucaptcha:d"},
		{store.Filter{Provider: "2captcha", State: store.StateRejected}, 10, ""},
		{store.Filter{Provider: "captchaai"}, 10, ""},
		{store.Filter{Provider: "2captch"}, 10, ""},
	}
	for _, tc := range tests {
		recs, err := s.List(ctx, tc.f, tc.limit)
		if err != nil {
			t.Fatalf("List(%+v, %d): %v", tc.f, tc.limit, err)
		}
		var got []string
		for _, r := range recs {
			got = append(got, r.Key().String())
		}
		if g := strings.Join(got, ","); g != tc.want {
			t.Errorf("List(%+v, %d) = %q, want %q", tc.f, tc.limit, g, tc.want)
		}
	}
}

func testClose(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	insert(t, s, queued("1", t0, t0))
	if _, err := s.AddTask(ctx, newTask("2", t0, t0)); err != nil {
		t.Fatal(err)
	}
	if !s.Available() {
		t.Error("Available() = false on an open store")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if s.Available() {
		t.Error("Available() = true after Close")
	}
	ops := map[string]func() error{
		"Insert": func() error { _, err := s.Insert(ctx, queued("3", t0, t0)); return err },
		"Get":    func() error { _, err := s.Get(ctx, key("1")); return err },
		"UpdateDelivery": func() error {
			_, err := s.UpdateDelivery(ctx, key("1"), func(*store.Delivery) error { return nil })
			return err
		},
		"Claim": func() error {
			_, err := h.claimAt(s, store.ClaimRequest{Now: t0, Limit: 1, Lease: time.Minute, Decide: Forward})
			return err
		},
		"Renew":   func() error { return s.Renew(ctx, key("1"), 1, t0) },
		"Expire":  func() error { _, err := s.Expire(ctx, t0.Add(2*retention), 10); return err },
		"List":    func() error { _, err := s.List(ctx, store.Filter{}, 10); return err },
		"AddTask": func() error { _, err := s.AddTask(ctx, newTask("4", t0, t0)); return err },
		"GetTask": func() error { _, err := s.GetTask(ctx, key("2")); return err },
		"DueTasks": func() error {
			_, err := s.DueTasks(ctx, store.DueQuery{Now: t0, Limit: 10, Accounts: anyAccount})
			return err
		},
		"UpdateTask": func() error {
			_, err := s.UpdateTask(ctx, key("2"), func(*store.Task) error { return nil })
			return err
		},
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}
