package pingback

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// TestObserveDelayBounded: with the PostgreSQL store and a database that
// does not take the delays (their table locked by another session),
// 2000 tracked pingbacks start no goroutine each: one writer holds at
// most one write and a bounded queue, the rest is dropped, counted and
// logged; once the database takes writes again, every queued delay is
// written.
func TestObserveDelayBounded(t *testing.T) {
	const n = 2000
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	h := &storeHandle{store: p}
	defer func() {
		if err := h.Destruct(); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	latencies := pgx.Identifier{schema, "latencies"}.Sanitize()
	lock, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "LOCK TABLE "+latencies+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	core, logs := observer.New(zap.WarnLevel)
	logger := zap.New(core)
	before := runtime.NumGoroutine()
	for i := range n {
		h.observeDelay("2captcha", time.Duration(i+1)*time.Millisecond, logger)
	}
	grown := runtime.NumGoroutine() - before
	if grown > 20 {
		t.Errorf("%d delays observed against a stalled database left %d more goroutines, want a bounded writer", n, grown)
	}
	if got := logs.FilterMessageSnippet("not recorded in the shared store").Len(); got != 1 {
		t.Errorf("%d warn lines about dropped delays, want 1 (logs %v)", got, logs.All())
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	w := h.delays
	if w == nil {
		t.Fatal("no delay writer for a shared store")
	}
	dropped := w.dropped.Load()
	if dropped < n-delayQueueSize-1 || dropped > n-delayQueueSize {
		t.Errorf("%d of %d delays dropped, want all but the queue (%d) and the one in flight", dropped, n, delayQueueSize)
	}
	want := n - dropped
	deadline := time.Now().Add(30 * time.Second)
	for {
		var rows int64
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+latencies).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows == want {
			break
		}
		if rows > want || time.Now().After(deadline) {
			t.Fatalf("%d delays written, want the %d queued", rows, want)
		}
		time.Sleep(50 * time.Millisecond) // polling the table, not synchronising with the writer
	}
}

func TestLatenciesAfter(t *testing.T) {
	repeat := func(d time.Duration, n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = d
		}
		return out
	}
	steps := func(step time.Duration, n int) []time.Duration {
		out := make([]time.Duration, n)
		for i := range out {
			out[i] = time.Duration(i+1) * step
		}
		return out
	}
	tests := []struct {
		name    string
		samples []time.Duration
		want    time.Duration
	}{
		{name: "no samples", want: 120 * time.Second},
		{name: "19 samples are too few", samples: repeat(time.Second, 19), want: 120 * time.Second},
		{name: "negative delays are not samples",
			samples: append(repeat(time.Second, 19), -time.Second), want: 120 * time.Second},
		{name: "fast provider clamps to 20s", samples: repeat(time.Second, 20), want: 20 * time.Second},
		// 1s..20s: the 95th percentile is 19s, times 1.5.
		{name: "20 samples", samples: steps(time.Second, 20), want: 28500 * time.Millisecond},
		// 0.5s..50s: the 95th percentile is 47.5s, times 1.5.
		{name: "100 samples", samples: steps(500*time.Millisecond, 100), want: 71250 * time.Millisecond},
		{name: "slow provider clamps to 120s", samples: repeat(100*time.Second, 50), want: 120 * time.Second},
		// Only the most recent 256 delays count: the old slow ones are gone.
		{name: "old samples are replaced",
			samples: append(repeat(200*time.Second, 300), repeat(30*time.Second, 256)...), want: 45 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l latencies
			for _, d := range tc.samples {
				l.observe(d)
			}
			if got := l.after(); got != tc.want {
				t.Errorf("after() = %s, want %s", got, tc.want)
			}
		})
	}
}
