package storetest

import (
	"net/http"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// erase runs ErasePayloads and returns how many it erased.
func erase(t *testing.T, s store.Store, before time.Time, limit int) int {
	t.Helper()
	n, err := s.ErasePayloads(ctx, before, limit)
	if err != nil {
		t.Fatalf("ErasePayloads(%s, %d): %v", fmtTime(before), limit, err)
	}
	return n
}

// wantErased checks that the stored record of id has no payload left and
// kept its key, times, state, attempts, statuses and history.
func wantErased(t *testing.T, s store.Store, id string, was *store.Record) {
	t.Helper()
	r := get(t, s, id)
	if !r.PayloadErased || r.Code != "" || r.Answer != nil || r.OtherCode != "" ||
		r.Request.Body != nil || r.Request.Header != nil || r.Request.URI != "/pingback/2captcha" {
		t.Errorf("%s after erasure: erased %v, code %q, answer %q, other %q, body %q, header %v, uri %q; want the payload gone",
			id, r.PayloadErased, r.Code, r.Answer, r.OtherCode, r.Request.Body, r.Request.Header, r.Request.URI)
	}
	if r.Key() != was.Key() || r.State != was.State || r.Attempts != was.Attempts || r.LastStatus != was.LastStatus ||
		!r.ReceivedAt.Equal(was.ReceivedAt) || !r.UpdatedAt.Equal(was.UpdatedAt) || !r.ExpiresAt.Equal(was.ExpiresAt) ||
		len(r.History) != len(was.History) || r.Request.Host != was.Request.Host || r.Request.Method != was.Request.Method ||
		r.Source != was.Source || r.Server != was.Server {
		t.Errorf("%s after erasure = %+v; want its key, state, times, attempts, statuses and history as %+v", id, r, was)
	}
}

// wantPayload checks that the stored record of id still has its payload.
func wantPayload(t *testing.T, s store.Store, id string) {
	t.Helper()
	r := get(t, s, id)
	if r.PayloadErased || r.Code != "CODE-"+id || len(r.Request.Body) == 0 || len(r.Request.Header) == 0 {
		t.Errorf("%s: erased %v, code %q, body %q, header %v; want its payload kept", id, r.PayloadErased, r.Code, r.Request.Body, r.Request.Header)
	}
}

// testErasePayloads: ErasePayloads erases the payload of delivered
// records delivered at or before its time, earliest first, up to its
// limit, and of nothing else; an erased record stays erased across a
// restart, and a duplicate insert finds it.
func testErasePayloads(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	delivered := func(id string, at time.Time) *store.Record {
		r := inState(id, t0, store.StateForwarding)
		r.Answer, r.OtherCode = []byte(`{"status":1,"request":"CODE-`+id+`"}`), "OTHER-"+id
		insert(t, s, r)
		update(t, s, id, func(d *store.Delivery) {
			d.State, d.Lease, d.LastStatus, d.UpdatedAt = store.StateDelivered, store.Lease{}, http.StatusOK, at
			d.StartAttempt(store.SourceCallback, t0)
			d.EndAttempt(d.Attempts, at, http.StatusOK, store.OutcomeDelivered, "")
		})
		return get(t, s, id)
	}
	early := delivered("early", t0.Add(time.Minute))
	first := delivered("first", t0.Add(30*time.Second))
	delivered("late", t0.Add(2*time.Hour))
	// Stored delivered by its insert (a result the app fetched itself).
	seen := inState("seen", t0, store.StateDelivered)
	seen.UpdatedAt = t0.Add(45 * time.Second)
	insert(t, s, seen)
	seen = get(t, s, "seen")
	failed := inState("failed", t0, store.StateFailed)
	failed.DueAt = t0.Add(24 * time.Hour)
	insert(t, s, failed, inState("parked", t0, store.StateParked), inState("rejected", t0, store.StateRejected),
		inState("quarantined", t0, store.StateQuarantined))

	cut := t0.Add(time.Hour)
	if n := erase(t, s, cut, 1); n != 1 {
		t.Fatalf("ErasePayloads(limit 1) erased %d, want 1", n)
	}
	wantErased(t, s, "first", first) // the earliest delivered first
	wantPayload(t, s, "early")
	if n := erase(t, s, cut, 100); n != 2 {
		t.Errorf("ErasePayloads erased %d, want 2 (early, seen)", n)
	}
	wantErased(t, s, "early", early)
	wantErased(t, s, "seen", seen)
	for _, id := range []string{"late", "failed", "parked", "rejected", "quarantined"} {
		wantPayload(t, s, id)
	}
	if n := erase(t, s, cut, 100); n != 0 {
		t.Errorf("ErasePayloads again erased %d, want 0", n)
	}

	// Replayed by hand after its delivery, delivered again later: erased
	// keep_payload after the later delivery, not the first.
	delivered("again", t0.Add(2*time.Minute))
	h.claimKeys(t, s, t0.Add(3*time.Hour), "again")
	update(t, s, "again", func(d *store.Delivery) {
		d.State, d.Lease, d.UpdatedAt = store.StateDelivered, store.Lease{}, t0.Add(3*time.Hour)
	})
	if n := erase(t, s, cut, 100); n != 0 {
		t.Errorf("ErasePayloads erased %d, want 0: the replayed result was delivered again after the cut", n)
	}
	wantPayload(t, s, "again")
	if n := erase(t, s, t0.Add(4*time.Hour), 100); n != 2 {
		t.Errorf("ErasePayloads(4h) erased %d, want 2 (late, again)", n)
	}
	wantErased(t, s, "again", get(t, s, "again"))
	for _, id := range []string{"failed", "parked", "rejected", "quarantined"} {
		wantPayload(t, s, id)
	}

	// A duplicate finds the erased record.
	res, err := s.Insert(ctx, inState("early", t0.Add(3*time.Hour), store.StateForwarding))
	if err != nil || res.Existing == nil || !res.Existing.PayloadErased || res.Existing.Code != "" {
		t.Errorf("duplicate insert of an erased result = %+v, %v; want the erased record as Existing", res.Existing, err)
	}
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		wantErased(t, s, "early", early)
		wantPayload(t, s, "failed")
		if n := erase(t, s, t0.Add(4*time.Hour), 100); n != 0 {
			t.Errorf("ErasePayloads after a restart erased %d, want 0", n)
		}
	}
}
