package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// testPauses: a pause is put, listed and deleted; putting it again keeps
// its since and by and changes its reason and until; "*" is a pause of
// its own; a timer's delete (dueBy) removes only a pause that is due; the
// pauses survive a restart.
func testPauses(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	mustPut := func(p store.Pause) store.Pause {
		t.Helper()
		got, err := s.PutPause(ctx, p)
		if err != nil {
			t.Fatalf("PutPause(%s): %v", p.Provider, err)
		}
		return got
	}
	list := func(s store.Store) []store.Pause {
		t.Helper()
		ps, err := s.ListPauses(ctx)
		if err != nil {
			t.Fatalf("ListPauses: %v", err)
		}
		return ps
	}
	if ps := list(s); len(ps) != 0 {
		t.Fatalf("a new store lists pauses %v", ps)
	}
	first := store.Pause{Provider: prov, Reason: "deploy", Since: t0, By: "api"}
	if got := mustPut(first); !samePause(got, first) {
		t.Errorf("PutPause returned %+v, want %+v", got, first)
	}
	again := store.Pause{Provider: prov, Reason: "migration", Since: t0.Add(time.Minute), Until: t0.Add(time.Hour), By: "cli"}
	want := store.Pause{Provider: prov, Reason: "migration", Since: t0, Until: t0.Add(time.Hour), By: "api"}
	if got := mustPut(again); !samePause(got, want) {
		t.Errorf("PutPause of a paused provider returned %+v, want %+v (since and by kept)", got, want)
	}
	all := store.Pause{Provider: store.PauseAll, Since: t0.Add(2 * time.Minute), By: "console"}
	mustPut(all)
	if ps := list(s); len(ps) != 2 || !samePause(ps[0], all) || !samePause(ps[1], want) {
		t.Fatalf("ListPauses = %+v, want [%+v %+v] (by provider)", ps, all, want)
	}

	if _, err := s.DeletePause(ctx, prov, t0.Add(time.Hour-time.Second)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a timer's DeletePause before the pause's until: %v, want ErrNotFound", err)
	}
	if _, err := s.DeletePause(ctx, store.PauseAll, t0.Add(24*time.Hour)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a timer's DeletePause of a pause without until: %v, want ErrNotFound", err)
	}
	if h.Reopen != nil {
		s = h.Reopen(t, s)
		if ps := list(s); len(ps) != 2 || !samePause(ps[0], all) || !samePause(ps[1], want) {
			t.Fatalf("after a restart, ListPauses = %+v, want [%+v %+v]", ps, all, want)
		}
	}
	got, err := s.DeletePause(ctx, prov, t0.Add(time.Hour))
	if err != nil || !samePause(got, want) {
		t.Errorf("a timer's DeletePause at the pause's until = %+v, %v; want %+v", got, err, want)
	}
	if _, err := s.DeletePause(ctx, prov, time.Time{}); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("DeletePause of a provider not paused: %v, want ErrNotFound", err)
	}
	if ps := list(s); len(ps) != 1 || ps[0].Provider != store.PauseAll {
		t.Errorf("after deleting %s, ListPauses = %+v; want only the pause of every provider", prov, ps)
	}
	if got, err := s.DeletePause(ctx, store.PauseAll, time.Time{}); err != nil || !samePause(got, all) {
		t.Errorf("DeletePause(*) = %+v, %v; want %+v", got, err, all)
	}
	if ps := list(s); len(ps) != 0 {
		t.Errorf("after every delete, ListPauses = %+v", ps)
	}
}

func samePause(a, b store.Pause) bool {
	return a.Provider == b.Provider && a.Reason == b.Reason && a.By == b.By &&
		a.Since.Equal(b.Since) && a.Until.Equal(b.Until)
}

// testClaimSkipProviders: held records of a skipped provider, due before
// any other and more than a claim's skip budget, do not stop another
// provider's due records from being claimed, and are left as they are;
// once no longer skipped they are claimed in due order.
func testClaimSkipProviders(t *testing.T, h Harness) {
	s := h.Open(t)
	t0 := base()
	const held = store.ClaimSkipBudget + 50
	const other = "captchaai"
	insertAll(t, s, held, func(i int) *store.Record {
		return queued(fmt.Sprintf("h%04d", i), t0, t0.Add(time.Duration(i)*time.Millisecond))
	})
	for i := range 4 {
		r := queued(fmt.Sprintf("o%d", i), t0, t0.Add(time.Second+time.Duration(i)*time.Millisecond))
		r.Provider = other
		insert(t, s, r)
	}
	now := t0.Add(time.Minute)
	for _, reserved := range []int{0, 2} {
		got := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: 2, Reserved: reserved, SkipProviders: []string{prov}})
		var keys []string
		for _, r := range got {
			keys = append(keys, r.Key().String())
		}
		if len(got) != 2 || slices.ContainsFunc(got, func(r *store.Record) bool { return r.Provider != other }) {
			t.Fatalf("claim (reserved %d) skipping %s took %v; want 2 records of %s", reserved, prov, keys, other)
		}
		if got := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: 1, SkipProviders: []string{prov, other}}); len(got) != 0 {
			t.Fatalf("claim skipping every provider took %v", ids(got))
		}
	}
	if r := get(t, s, "h0000"); r.State != store.StateQueued || r.Attempts != 0 {
		t.Errorf("a skipped record: state %s, attempts %d; want queued, 0", r.State, r.Attempts)
	}
	if got := h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: 2, SkipProviders: []string{other}}); len(got) != 2 || got[0].ID != "h0000" || got[1].ID != "h0001" {
		t.Errorf("claim without skipping %s took %v; want h0000, h0001 (due order)", prov, ids(got))
	}
}
