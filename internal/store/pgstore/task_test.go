package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestPostgresTaskReadRetried: the task read that judges a pingback
// (GetTask) survives every pooled connection of the store being
// terminated (pg_terminate_backend, SQLSTATE 57P01, as a restart leaves
// them): a task that exists is read, one that does not is ErrNotFound,
// each after one retry on a new connection; with no time left in the
// context, the connection's error stands (no retry), and it is not
// ErrNotFound.
func TestPostgresTaskReadRetried(t *testing.T) {
	base := pgtest.DSN(t)
	p, logs, app := openPGNamed(t, base, pgtest.Schema(t, base))
	now := time.Now().UTC()
	task := &store.Task{Provider: "2captcha", ID: "4242", SubmittedAt: now, PingbackURL: "http://x/cb",
		State: store.TaskPending, NextPollAt: now.Add(time.Minute), ExpiresAt: now.Add(time.Hour), Token: "t0k"}
	if _, err := p.AddTask(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		id       string
		canceled bool
		check    func(t *testing.T, got *store.Task, err error)
	}{
		{"found", "4242", false, func(t *testing.T, got *store.Task, err error) {
			if err != nil || got == nil || got.Token != "t0k" {
				t.Fatalf("GetTask = %+v, %v; want the task after one retry", got, err)
			}
		}},
		{"not found", "4343", false, func(t *testing.T, got *store.Task, err error) {
			if !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("GetTask = %+v, %v; want ErrNotFound after one retry", got, err)
			}
		}},
		{"no time left", "4242", true, func(t *testing.T, got *store.Task, err error) {
			if err == nil || errors.Is(err, store.ErrNotFound) {
				t.Fatalf("GetTask with no time left = %+v, %v; want the connection's error", got, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := p.GetTask(context.Background(), task.Key()); err != nil { // a pooled connection
				t.Fatal(err)
			}
			if n := pgtest.Terminate(t, base, app); n == 0 {
				t.Fatal("no backend of the store to terminate")
			}
			logs.TakeAll()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the handler's ack_timeout
			if tt.canceled {
				cancel()
			}
			got, err := p.GetTask(ctx, store.Key{Provider: "2captcha", ID: tt.id})
			cancel()
			tt.check(t, got, err)
			retried := logs.FilterMessage("postgres connection lost; retrying once on a new connection").All()
			switch {
			case tt.canceled && len(retried) != 0:
				t.Errorf("retried with no time left: %v", retried)
			case !tt.canceled:
				wantLog(t, logs, "postgres connection lost; retrying once on a new connection", "task read")
			}
		})
	}
}
