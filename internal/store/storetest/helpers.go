package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// prov is the provider of the suite's records and tasks.
const prov = "2captcha"

// retention is how long the suite's records and tasks are kept unless a
// test says otherwise.
const retention = 30 * 24 * time.Hour

// leaseLen is the ClaimRequest.Lease of the suite's claims on stores
// without a lease term.
const leaseLen = time.Minute

var ctx = context.Background()

// base is the time a test starts from: a whole second an hour after the
// wall clock, so that records stored relative to it (expiry included) are
// live for a store that expires records by its own clock (Badger TTL),
// while every time the store is given is still injected by the test.
func base() time.Time { return time.Now().UTC().Truncate(time.Second).Add(time.Hour) }

// key is the suite's key of id.
func key(id string) store.Key { return store.Key{Provider: prov, ID: id} }

// newRecord is a result received at t0 with delivery state d, kept for
// the suite's retention.
func newRecord(id string, t0 time.Time, d store.Delivery) *store.Record {
	return &store.Record{
		Provider:   prov,
		ID:         id,
		Code:       "CODE-" + id,
		Source:     store.SourceCallback,
		ReceivedAt: t0,
		Server:     "srv0",
		Request: store.Request{
			Method:     http.MethodPost,
			URI:        "/pingback/2captcha?id=" + id,
			Host:       "example.com",
			Proto:      "HTTP/1.1",
			RemoteAddr: "192.0.2.1:4242",
			LocalAddr:  "198.51.100.1:8443",
			TLS:        true,
			Header:     http.Header{"Content-Type": {"application/x-www-form-urlencoded"}},
			Body:       []byte("id=" + id + "&code=CODE-" + id),
		},
		Delivery:  d,
		ExpiresAt: t0.Add(retention),
	}
}

// queued is a record waiting for its forward from due on.
func queued(id string, t0, due time.Time) *store.Record {
	return newRecord(id, t0, store.Delivery{State: store.StateQueued, DueAt: due, UpdatedAt: t0})
}

// inState is a record in state st: due at t0 if st is queued or failed,
// leased until t0 plus a minute if forwarding.
func inState(id string, t0 time.Time, st store.State) *store.Record {
	d := store.Delivery{State: st, Attempts: 1, UpdatedAt: t0}
	switch st {
	case store.StateQueued:
		d.Attempts = 0
		d.DueAt = t0
	case store.StateFailed:
		d.Failures, d.DueAt, d.LastStatus, d.LastError = 1, t0, 503, "app answered 503"
	case store.StateForwarding:
		d.Lease.Until = t0.Add(time.Minute)
	case store.StateRejected:
		d.LastStatus, d.LastError = 422, "app answered 422"
	case store.StateParked:
		d.Attempts, d.Failures, d.LastStatus, d.LastError = 5, 5, 502, "app answered 502"
	}
	return newRecord(id, t0, d)
}

// cloneRecord is a deep copy of r.
func cloneRecord(r *store.Record) *store.Record {
	c := *r
	c.Request.Header = r.Request.Header.Clone()
	c.Request.Body = bytes.Clone(r.Request.Body)
	return &c
}

func insert(t *testing.T, s store.Store, recs ...*store.Record) {
	t.Helper()
	for _, r := range recs {
		res, err := s.Insert(ctx, r)
		if err != nil {
			t.Fatalf("Insert(%s): %v", r.Key(), err)
		}
		if res.Existing != nil {
			t.Fatalf("Insert(%s): reported a duplicate of %+v", r.Key(), res.Existing)
		}
	}
}

func get(t *testing.T, s store.Store, id string) *store.Record {
	t.Helper()
	r, err := s.Get(ctx, key(id))
	if err != nil {
		t.Fatalf("Get(%s): %v", id, err)
	}
	return r
}

func wantNotFound(t *testing.T, s store.Store, id string) {
	t.Helper()
	if r, err := s.Get(ctx, key(id)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(%s) = %+v, %v; want ErrNotFound", id, r, err)
	}
}

func update(t *testing.T, s store.Store, id string, fn func(d *store.Delivery)) store.Delivery {
	t.Helper()
	d, err := s.UpdateDelivery(ctx, key(id), func(d *store.Delivery) error { fn(d); return nil })
	if err != nil {
		t.Fatalf("UpdateDelivery(%s): %v", id, err)
	}
	return d
}

// Forward is the suite's usual Decide (store.ClaimRequest.Decide): claim
// every record for one more attempt, counting a lapsed lease as an
// interrupt (so that the claimed record shows whether Decide was told it
// lapsed). A driver's own tests may claim with it too.
func Forward(d *store.Delivery, lapsed bool) {
	if lapsed {
		d.Interrupts++
	}
	d.State = store.StateForwarding
	d.Attempts++
}

func (h Harness) claimReq(t *testing.T, s store.Store, req store.ClaimRequest) []*store.Record {
	t.Helper()
	if req.Decide == nil && req.DecideRecord == nil {
		req.Decide = Forward
	}
	if req.Lease == 0 {
		req.Lease = leaseLen
	}
	recs, err := h.claimAt(s, req)
	if err != nil {
		t.Fatalf("Claim(now %s, limit %d, keys %v): %v", req.Now.Format(time.RFC3339Nano), req.Limit, req.Keys, err)
	}
	return recs
}

// claim claims up to limit due records at now with forward and a lease
// of leaseLen.
func (h Harness) claim(t *testing.T, s store.Store, now time.Time, limit int) []*store.Record {
	t.Helper()
	return h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: limit})
}

// claimKeys claims the records of ids at now with forward.
func (h Harness) claimKeys(t *testing.T, s store.Store, now time.Time, ids ...string) []*store.Record {
	t.Helper()
	keys := make([]store.Key, 0, len(ids))
	for _, id := range ids {
		keys = append(keys, key(id))
	}
	return h.claimReq(t, s, store.ClaimRequest{Now: now, Limit: len(ids), Keys: keys})
}

func ids(recs []*store.Record) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, r.ID)
	}
	return out
}

func wantIDs(t *testing.T, what string, recs []*store.Record, want ...string) {
	t.Helper()
	if got := ids(recs); !slices.Equal(got, want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

// checkLeased checks that r (and the stored record) is forwarding under a
// lease of s from now for lease, with no due time.
func checkLeased(t *testing.T, s store.Store, r *store.Record, now time.Time, lease time.Duration) {
	t.Helper()
	for _, x := range []struct {
		what string
		d    store.Delivery
	}{{"claimed", r.Delivery}, {"stored", get(t, s, r.ID).Delivery}} {
		d := x.d
		if d.State != store.StateForwarding || d.Lease.Owner != s.Owner() || !d.Lease.Until.Equal(now.Add(lease)) || !d.DueAt.IsZero() {
			t.Errorf("%s %s: state %s lease %+v due %s; want forwarding, lease {%s %s}, no due time",
				x.what, r.ID, d.State, d.Lease, fmtTime(d.DueAt), s.Owner(), fmtTime(now.Add(lease)))
		}
	}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "0"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// diffDelivery lists how got differs from want.
func diffDelivery(got, want store.Delivery) string {
	var d diffs
	differ(&d, "state", got.State, want.State)
	differ(&d, "attempts", got.Attempts, want.Attempts)
	differ(&d, "failures", got.Failures, want.Failures)
	differ(&d, "interrupts", got.Interrupts, want.Interrupts)
	d.time("due_at", got.DueAt, want.DueAt)
	if got.Lease.Owner != want.Lease.Owner || !got.Lease.Until.Equal(want.Lease.Until) {
		d.add("lease", got.Lease.Owner+" "+fmtTime(got.Lease.Until), want.Lease.Owner+" "+fmtTime(want.Lease.Until))
	}
	differ(&d, "last_status", got.LastStatus, want.LastStatus)
	if got.LastError != want.LastError {
		d.add("last_error", fmt.Sprintf("%q", got.LastError), fmt.Sprintf("%q", want.LastError))
	}
	d.time("updated_at", got.UpdatedAt, want.UpdatedAt)
	if h := diffHistory(got.History, want.History); h != "" {
		d.add("history", h, "")
	}
	return d.String()
}

// diffHistory says how the history got differs from want ("" if not):
// times by instant.
func diffHistory(got, want []store.Attempt) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d attempts %+v, want %d %+v", len(got), got, len(want), want)
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Attempt != w.Attempt || g.Source != w.Source || !g.StartedAt.Equal(w.StartedAt) || !g.EndedAt.Equal(w.EndedAt) ||
			g.Status != w.Status || g.Outcome != w.Outcome || g.Error != w.Error {
			return fmt.Sprintf("attempt %d: %+v, want %+v", i, g, w)
		}
	}
	return ""
}

// diffRecord lists how got differs from want, field by field (times by
// instant, headers and body by value).
func diffRecord(got, want *store.Record) string {
	var d diffs
	differ(&d, "key", got.Key(), want.Key())
	differ(&d, "code", got.Code, want.Code)
	differ(&d, "source", got.Source, want.Source)
	differ(&d, "server", got.Server, want.Server)
	if got.Verified != want.Verified || got.Tracked != want.Tracked || got.Quarantine != want.Quarantine ||
		got.OtherCode != want.OtherCode || got.Correction != want.Correction {
		d.add("verification", fmt.Sprintf("verified %q tracked %v quarantine %q other %q correction %v", got.Verified, got.Tracked, got.Quarantine, got.OtherCode, got.Correction),
			fmt.Sprintf("verified %q tracked %v quarantine %q other %q correction %v", want.Verified, want.Tracked, want.Quarantine, want.OtherCode, want.Correction))
	}
	d.time("received_at", got.ReceivedAt, want.ReceivedAt)
	d.time("submitted_at", got.SubmittedAt, want.SubmittedAt)
	d.time("expires_at", got.ExpiresAt, want.ExpiresAt)
	gr, wr := got.Request, want.Request
	if gr.Method != wr.Method || gr.URI != wr.URI || gr.Host != wr.Host || gr.Proto != wr.Proto ||
		gr.RemoteAddr != wr.RemoteAddr || gr.LocalAddr != wr.LocalAddr || gr.TLS != wr.TLS {
		d.add("request", fmt.Sprintf("%s %s host %s %s from %s to %s tls %v", gr.Method, gr.URI, gr.Host, gr.Proto, gr.RemoteAddr, gr.LocalAddr, gr.TLS),
			fmt.Sprintf("%s %s host %s %s from %s to %s tls %v", wr.Method, wr.URI, wr.Host, wr.Proto, wr.RemoteAddr, wr.LocalAddr, wr.TLS))
	}
	if !(len(gr.Header) == 0 && len(wr.Header) == 0) && !maps.EqualFunc(gr.Header, wr.Header, slices.Equal) {
		d.add("header", gr.Header, wr.Header)
	}
	if !bytes.Equal(gr.Body, wr.Body) {
		d.add("body", fmt.Sprintf("%q", gr.Body), fmt.Sprintf("%q", wr.Body))
	}
	if dd := diffDelivery(got.Delivery, want.Delivery); dd != "" {
		d = append(d, dd)
	}
	return d.String()
}

func newTask(id string, t0, next time.Time) *store.Task {
	return &store.Task{
		Provider:    prov,
		ID:          id,
		Method:      "userrecaptcha",
		SubmittedAt: t0,
		PingbackURL: "https://example.com/pingback/2captcha",
		State:       store.TaskPending,
		NextPollAt:  next,
		UpdatedAt:   t0,
		ExpiresAt:   t0.Add(retention),
	}
}

// diffTask lists how got differs from want.
func diffTask(got, want *store.Task) string {
	var d diffs
	differ(&d, "key", got.Key(), want.Key())
	differ(&d, "method", got.Method, want.Method)
	differ(&d, "pingback_url", got.PingbackURL, want.PingbackURL)
	differ(&d, "state", got.State, want.State)
	differ(&d, "polls", got.Polls, want.Polls)
	differ(&d, "last_error", got.LastError, want.LastError)
	differ(&d, "token", got.Token, want.Token)
	differ(&d, "account", got.Account, want.Account)
	d.time("submitted_at", got.SubmittedAt, want.SubmittedAt)
	d.time("next_poll_at", got.NextPollAt, want.NextPollAt)
	d.time("updated_at", got.UpdatedAt, want.UpdatedAt)
	d.time("expires_at", got.ExpiresAt, want.ExpiresAt)
	d.time("result_at", got.ResultAt, want.ResultAt)
	return d.String()
}

// diffs are the differences diffRecord, diffDelivery and diffTask list,
// one "field got, want want" each.
type diffs []string

func (d *diffs) add(field string, g, w any) {
	*d = append(*d, fmt.Sprintf("%s %v, want %v", field, g, w))
}

// time adds field if g and w are different instants.
func (d *diffs) time(field string, g, w time.Time) {
	if !g.Equal(w) {
		d.add(field, fmtTime(g), fmtTime(w))
	}
}

func (d diffs) String() string { return strings.Join(d, "; ") }

// differ adds field to d if g and w differ.
func differ[T comparable](d *diffs, field string, g, w T) {
	if g != w {
		d.add(field, g, w)
	}
}

// addInState stores tk in state (a task no longer pending has no next
// poll) and returns it.
func addInState(t *testing.T, s store.Store, tk *store.Task, state store.TaskState) *store.Task {
	t.Helper()
	if tk.State = state; tk.State != store.TaskPending {
		tk.NextPollAt = time.Time{}
	}
	if _, err := s.AddTask(ctx, tk); err != nil {
		t.Fatal(err)
	}
	return tk
}

// sortTasks sorts ts in task-page order (store.CompareTaskPosition).
func sortTasks(ts []*store.Task) {
	slices.SortFunc(ts, func(a, b *store.Task) int {
		return store.CompareTaskPosition(store.TaskPositionOf(a), store.TaskPositionOf(b))
	})
}

func taskIDs(ts []*store.Task) []string {
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.ID)
	}
	return out
}

// anyAccount is the account of the suite's tasks without one.
var anyAccount = []store.Account{{Provider: prov}}

// dueTaskIDs is the ids of the due tasks of the suite's tasks without
// account.
func dueTaskIDs(t *testing.T, s store.Store, now time.Time, limit int) []string {
	t.Helper()
	ts, err := s.DueTasks(ctx, store.DueQuery{Now: now, Limit: limit, Accounts: anyAccount})
	if err != nil {
		t.Fatalf("DueTasks(%s, %d): %v", fmtTime(now), limit, err)
	}
	return taskIDs(ts)
}
