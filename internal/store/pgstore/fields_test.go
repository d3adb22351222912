package pgstore_test

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
)

// allSet fails t for every zero field of v, a struct (nested structs
// included): a field added to store.Record or store.Task must be added
// here, and so to the PostgreSQL columns that carry it.
func allSet(t *testing.T, what string, v reflect.Value) {
	t.Helper()
	for i := range v.NumField() {
		f, name := v.Field(i), what+"."+v.Type().Field(i).Name
		switch {
		case name == "Record.Held": // computed when shown, never stored
		case f.Kind() == reflect.Struct && f.Type() != reflect.TypeFor[time.Time]():
			allSet(t, name, f)
		case f.IsZero():
			t.Errorf("%s is zero in the round-trip test: set it, and store it in PostgreSQL", name)
		}
	}
}

// TestPostgresCarriesEveryField: a record and a task with every field set
// read back from PostgreSQL exactly as written.
func TestPostgresCarriesEveryField(t *testing.T) {
	dsn := pgtest.DSN(t)
	p := openPG(t, dsn, pgtest.Schema(t, dsn))
	ctx := context.Background()
	at := func(s int) time.Time { return time.Date(2026, 12, 1, 10, 0, s, 123456789, time.UTC) }
	rec := &store.Record{
		Provider: "2captcha", ID: "99", Code: "C\x00ODE", Answer: []byte(`{"status":1}`), Source: store.SourcePoll,
		ReceivedAt: at(1), SubmittedAt: at(2), Server: "srv7",
		Request: store.Request{Method: "POST", URI: "/cb?x=1", Host: "example.com:8443", Proto: "HTTP/2.0",
			RemoteAddr: "192.0.2.1:1", LocalAddr: "198.51.100.1:8443", TLS: true,
			Header: http.Header{"A": {"b"}}, Body: []byte{0, 1, 2}},
		Delivery: store.Delivery{State: store.StateForwarding, Attempts: 3, Failures: 2, Interrupts: 1, DueAt: at(3),
			Lease: store.Lease{Owner: "someone", Until: at(4)}, LastStatus: 502, LastError: "app answered 502", UpdatedAt: at(5),
			History: []store.Attempt{{Attempt: 3, Source: store.SourceManual, StartedAt: at(7), EndedAt: at(8), Status: 502,
				Outcome: store.OutcomeFailed, Error: "app answered 502"}},
			ExpiredReason: "max_age"},
		ExpiresAt: at(6),
		Verified:  store.VerifiedToken, Tracked: true, Quarantine: "unknown_id", OtherCode: "O\x00THER\xff", Correction: true,
		PayloadErased: true,
	}
	allSet(t, "Record", reflect.ValueOf(*rec))
	if _, err := p.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// Insert takes the lease for this handle, relative to the clock, and a
	// forwarding record has no due time: set what UpdateDelivery keeps as
	// given, then compare.
	if _, err := p.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error { *d = rec.Delivery; return nil }); err != nil {
		t.Fatal(err)
	}
	want := *rec
	want.DueAt = time.Time{}
	got, err := p.Get(ctx, rec.Key())
	if err != nil {
		t.Fatal(err)
	}
	if g, w := mustJSON(t, got), mustJSON(t, &want); g != w {
		t.Errorf("record read back\n got %s\nwant %s", g, w)
	}

	task := &store.Task{Provider: "2captcha", ID: "100", Method: "userrecaptcha", API: "json", SubmittedAt: at(1),
		PingbackURL: "https://example.com/cb", Server: "srv7", State: store.TaskPending, NextPollAt: at(2), Polls: 4,
		AppPolls: 2, AppPolledAt: at(3), LastError: "CAPCHA_NOT_READY", UpdatedAt: at(4), ExpiresAt: at(5), ResultAt: at(6),
		Token: "0123456789abcdef0123456789abcdef", Account: "00112233445566aa"}
	allSet(t, "Task", reflect.ValueOf(*task))
	if _, err := p.AddTask(ctx, task); err != nil {
		t.Fatal(err)
	}
	gt, err := p.GetTask(ctx, task.Key())
	if err != nil {
		t.Fatal(err)
	}
	if g, w := mustJSON(t, gt), mustJSON(t, task); g != w {
		t.Errorf("task read back\n got %s\nwant %s", g, w)
	}
	changed := *task
	changed.AppPolls, changed.API, changed.Server, changed.Account = 9, "legacy", "srv8", "ffeeddccbbaa9988"
	if _, err := p.UpdateTask(ctx, task.Key(), func(tk *store.Task) error { *tk = changed; return nil }); err != nil {
		t.Fatal(err)
	}
	if gt, err = p.GetTask(ctx, task.Key()); err != nil || mustJSON(t, gt) != mustJSON(t, &changed) {
		t.Errorf("task after UpdateTask = %s, %v; want %s", mustJSON(t, gt), err, mustJSON(t, &changed))
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
