package pingback

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestLeaseRenewal: on a store whose leases must be renewed (as a shared
// store's are), a forward renews its lease every third of the term while it
// runs; once the lease is lost (another owner claimed the record after it
// lapsed) the renewal fails and the forward is cut at once, so two owners
// never forward the same record at the same time.
func TestLeaseRenewal(t *testing.T) {
	const term = 300 * time.Millisecond
	st, err := store.OpenBadger(store.BadgerOptions{Dir: t.TempDir(), LeaseTerm: term})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a := &App{logger: zap.NewNop(), now: time.Now}
	ctx := context.Background()
	now := time.Now().UTC()
	rec := &store.Record{
		Provider: "captchaai", ID: "40001", Code: "TOKEN", Source: store.SourceCallback, ReceivedAt: now,
		Request:   store.Request{Method: http.MethodGet, URI: "/cb?id=40001&code=TOKEN", Host: "localhost"},
		Delivery:  store.Delivery{State: store.StateForwarding, Attempts: 1, Lease: store.Lease{Until: now.Add(term)}, UpdatedAt: now},
		ExpiresAt: now.Add(time.Hour),
	}
	if _, err := st.Insert(ctx, rec); err != nil {
		t.Fatal(err)
	}
	leaseUntil := func() time.Time {
		t.Helper()
		got, err := st.Get(ctx, rec.Key())
		if err != nil {
			t.Fatal(err)
		}
		return got.Lease.Until
	}

	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := a.renewWhileRunning(fctx, cancel, st, rec.Key(), 1, term)
	defer stop()
	first := leaseUntil()
	waitFor(t, 5*time.Second, "two renewals", func() bool { return leaseUntil().After(first.Add(term / 2)) })
	if fctx.Err() != nil {
		t.Fatalf("the forward was cut while its renewals succeeded: %v", context.Cause(fctx))
	}

	// Another owner takes the record over: the next renewal fails.
	if _, err := st.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
		d.Attempts++
		d.Lease.Owner = "another instance"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the forward went on after its lease was lost")
	}
	if cause := context.Cause(fctx); !errors.Is(cause, errLeaseLost) {
		t.Errorf("the forward was cut with %v, want errLeaseLost", cause)
	}
	if out := cutShort(outcome{class: retryable, status: http.StatusBadGateway}, context.Cause(fctx)); out.class != interrupted {
		t.Errorf("a forward cut by a lost lease is recorded as %s, want interrupted", out.class)
	}
}
