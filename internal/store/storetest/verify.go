package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// The verification side of the contract: quarantined results, results
// older than their task, and whole-record updates.

// quarantined is a result kept in quarantine for reason why.
func quarantined(id string, t0 time.Time, why string) *store.Record {
	r := newRecord(id, t0, store.Delivery{State: store.StateQuarantined, UpdatedAt: t0})
	r.Verified, r.Quarantine = store.VerifiedNone, why
	return r
}

func getTask(t *testing.T, s store.Store, id string) *store.Task {
	t.Helper()
	gt, err := s.GetTask(ctx, key(id))
	if err != nil {
		t.Fatalf("GetTask(%s): %v", id, err)
	}
	return gt
}

func testVerifyFields(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	rec := inState("70", t0, store.StateForwarding)
	rec.Verified, rec.Tracked, rec.Quarantine = store.VerifiedToken, true, "unknown_id"
	rec.OtherCode, rec.Correction = "OTHER\xff\x00code", true
	insert(t, s, rec)
	want := cloneRecord(rec)
	want.Lease.Owner = s.Owner()
	if d := diffRecord(get(t, s, "70"), want); d != "" {
		t.Errorf("record read back: %s", d)
	}
	task := newTask("71", t0, t0.Add(time.Minute))
	task.Token = "0123456789abcdef0123456789abcdef"
	if _, err := s.AddTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	if d := diffTask(getTask(t, s, "71"), task); d != "" {
		t.Errorf("task read back: %s", d)
	}
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		if got := getTask(t, s, "71"); got.Token != task.Token {
			t.Errorf("token after reopen = %q, want %q", got.Token, task.Token)
		}
		if got := get(t, s, "70"); got.OtherCode != rec.OtherCode || got.Verified != rec.Verified || !got.Tracked || !got.Correction {
			t.Errorf("verification after reopen = %+v", got)
		}
	}
}

func testQuarantinedKeepsTaskPending(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	next := t0.Add(time.Minute)
	if _, err := s.AddTask(ctx, newTask("72", t0.Add(-time.Minute), next)); err != nil {
		t.Fatal(err)
	}
	res, err := s.Insert(ctx, quarantined("72", t0, "token_mismatch"))
	if err != nil || res.Existing != nil {
		t.Fatalf("Insert = %+v, %v", res, err)
	}
	if !res.SubmittedAt.IsZero() {
		t.Errorf("a quarantined insert reported the task's submission time %s: it completed nothing", fmtTime(res.SubmittedAt))
	}
	if gt := getTask(t, s, "72"); gt.State != store.TaskPending || !gt.NextPollAt.Equal(next) {
		t.Errorf("task after a quarantined result: %s next poll %s; want pending, still polled at %s", gt.State, fmtTime(gt.NextPollAt), fmtTime(next))
	}
	if got := dueTaskIDs(t, s, next, 10); len(got) != 1 || got[0] != "72" {
		t.Errorf("DueTasks = %v, want [72]", got)
	}
	recs, err := s.List(ctx, store.Filter{State: store.StateQuarantined}, 10)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "List(quarantined)", recs, "72")
	// A task added after a quarantined result stays pending too.
	insert(t, s, quarantined("73", t0, "unknown_id"))
	if ex, err := s.AddTask(ctx, newTask("73", t0.Add(-time.Minute), next)); err != nil || ex != nil {
		t.Fatalf("AddTask = %+v, %v", ex, err)
	}
	if gt := getTask(t, s, "73"); gt.State != store.TaskPending {
		t.Errorf("task added after its quarantined result: %s, want pending", gt.State)
	}
	// Nothing claims a quarantined record.
	if got := h.claim(t, s, t0.Add(time.Hour), 10); len(got) != 0 {
		t.Errorf("Claim took quarantined records: %v", ids(got))
	}
}

func testResultBeforeSubmission(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	next := t0.Add(time.Minute)
	// Stored first, its task submitted a second later: the task is not
	// completed by the older result.
	insert(t, s, inState("74", t0, store.StateForwarding))
	if ex, err := s.AddTask(ctx, newTask("74", t0.Add(time.Second), next)); err != nil || ex != nil {
		t.Fatalf("AddTask = %+v, %v", ex, err)
	}
	if gt := getTask(t, s, "74"); gt.State != store.TaskPending || !gt.ResultAt.IsZero() {
		t.Errorf("task submitted after its stored result: %s (result at %s); want pending", gt.State, fmtTime(gt.ResultAt))
	}
	// Received at the submission's very time: it completes it.
	insert(t, s, inState("75", t0, store.StateForwarding))
	if _, err := s.AddTask(ctx, newTask("75", t0, next)); err != nil {
		t.Fatal(err)
	}
	if gt := getTask(t, s, "75"); gt.State != store.TaskDone {
		t.Errorf("task submitted at its result's received time: %s, want done", gt.State)
	}
	// The task known first, the result stamped before it (a clock that
	// went back, a hand-made record): no completion either.
	if _, err := s.AddTask(ctx, newTask("76", t0.Add(time.Second), next)); err != nil {
		t.Fatal(err)
	}
	res, err := s.Insert(ctx, inState("76", t0, store.StateForwarding))
	if err != nil || !res.SubmittedAt.IsZero() {
		t.Errorf("Insert of a result older than its task = %+v, %v; want no submission time", res, err)
	}
	if gt := getTask(t, s, "76"); gt.State != store.TaskPending {
		t.Errorf("task after an older result: %s, want pending", gt.State)
	}
}

func testUpdateRecord(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	if _, err := s.UpdateRecord(ctx, key("nope"), func(*store.Record) error { return nil }); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateRecord of a missing key: %v, want ErrNotFound", err)
	}
	rec := queued("77", t0, t0)
	insert(t, s, rec)
	boom := errors.New("boom")
	got, err := s.UpdateRecord(ctx, key("77"), func(r *store.Record) error { r.Code = "X"; return boom })
	if !errors.Is(err, boom) || got == nil || got.Code != rec.Code {
		t.Errorf("UpdateRecord with a failing fn = %v, %v; want the unchanged record and the error", got, err)
	}
	t1 := t0.Add(time.Second)
	got, err = s.UpdateRecord(ctx, key("77"), func(r *store.Record) error {
		r.ID = "other" // the key cannot change
		r.Code, r.OtherCode, r.Correction, r.Verified = "NEW", r.Code, true, store.VerifiedResPHP
		r.Request.Body = []byte("id=77&code=NEW")
		r.State, r.DueAt, r.UpdatedAt = store.StateQueued, t1, t1
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := cloneRecord(rec)
	want.Code, want.OtherCode, want.Correction, want.Verified = "NEW", rec.Code, true, store.VerifiedResPHP
	want.Request.Body = []byte("id=77&code=NEW")
	want.DueAt, want.UpdatedAt = t1, t1
	if d := diffRecord(got, want); d != "" {
		t.Errorf("UpdateRecord's answer: %s", d)
	}
	if d := diffRecord(get(t, s, "77"), want); d != "" {
		t.Errorf("record after UpdateRecord: %s", d)
	}
	wantNotFound(t, s, "other")
	// The indexes follow: due at t1, not before.
	if c := h.claim(t, s, t0, 10); len(c) != 0 {
		t.Errorf("claimed before its new due time: %v", ids(c))
	}
	wantIDs(t, "Claim at the new due time", h.claim(t, s, t1, 10), "77")
}

func testUpdateRecordReleases(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	next := t0.Add(time.Minute)
	if _, err := s.AddTask(ctx, newTask("78", t0.Add(-time.Minute), next)); err != nil {
		t.Fatal(err)
	}
	insert(t, s, quarantined("78", t0, "token_mismatch"))
	// Still quarantined (another reason): the task stays pending.
	if _, err := s.UpdateRecord(ctx, key("78"), func(r *store.Record) error { r.Quarantine = "not_confirmed"; return nil }); err != nil {
		t.Fatal(err)
	}
	if gt := getTask(t, s, "78"); gt.State != store.TaskPending {
		t.Fatalf("task after a quarantined update: %s, want pending", gt.State)
	}
	t1 := t0.Add(2 * time.Second)
	got, err := s.UpdateRecord(ctx, key("78"), func(r *store.Record) error {
		r.State, r.DueAt, r.UpdatedAt = store.StateQueued, t1, t1
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.StateQueued || got.Quarantine != "not_confirmed" {
		t.Errorf("released record: %s (quarantine %q)", got.State, got.Quarantine)
	}
	gt := getTask(t, s, "78")
	if gt.State != store.TaskDone || !gt.ResultAt.Equal(t0) {
		t.Errorf("task after its result left quarantine: %s result at %s; want done at %s", gt.State, fmtTime(gt.ResultAt), fmtTime(t0))
	}
	if got := get(t, s, "78"); !got.SubmittedAt.Equal(t0.Add(-time.Minute)) {
		t.Errorf("released record's submitted_at = %s, want its task's", fmtTime(got.SubmittedAt))
	}
	recs, err := s.List(ctx, store.Filter{State: store.StateQuarantined}, 10)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "List(quarantined) after release", recs)
	// A quarantined result older than its task, released: delivered, but
	// the task is not completed by it.
	if _, err := s.AddTask(ctx, newTask("79", t0.Add(time.Second), next)); err != nil {
		t.Fatal(err)
	}
	insert(t, s, quarantined("79", t0, "before_submission"))
	if _, err := s.UpdateRecord(ctx, key("79"), func(r *store.Record) error {
		r.State, r.DueAt, r.UpdatedAt = store.StateQueued, t1, t1
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if gt := getTask(t, s, "79"); gt.State != store.TaskPending {
		t.Errorf("task after releasing a result older than it: %s, want pending", gt.State)
	}
}
