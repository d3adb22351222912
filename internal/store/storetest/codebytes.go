package storetest

import (
	"testing"
	"time"
)

// testCodeBytes checks that a code is stored as bytes, unchanged: one that
// is not valid UTF-8 (and holds a NUL) reads back byte for byte, after a
// restart too, and its identical re-delivery finds the same bytes, so the
// caller counts it a duplicate, not a conflict.
func testCodeBytes(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	const code = "\xff\xfe\x00\xc3\x28TOKEN\x80\xed\xa0\x80"
	rec := queued("8080", t0, t0.Add(time.Hour))
	rec.Code = code
	rec.Answer = []byte(`{"status":1,"request":"` + "\xff" + `"}`)
	insert(t, s, rec)
	if got := get(t, s, "8080"); got.Code != code || string(got.Answer) != string(rec.Answer) {
		t.Errorf("Get: code %q answer %q; want %q and %q unchanged", got.Code, got.Answer, code, rec.Answer)
	}
	again := queued("8080", t0.Add(time.Second), t0.Add(time.Hour))
	again.Code = code
	res, err := s.Insert(ctx, again)
	if err != nil {
		t.Fatalf("re-delivery: %v", err)
	}
	if res.Existing == nil || res.Existing.Code != again.Code {
		t.Fatalf("re-delivery of the same bytes: Existing %+v; want the stored record with the identical code", res.Existing)
	}
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		if got := get(t, s, "8080"); got.Code != code {
			t.Errorf("Get after a restart: code %q, want %q", got.Code, code)
		}
	}
}
