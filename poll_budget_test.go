package pingback

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestJSONPollsInSharedBudget: with the PostgreSQL store, the plugin's
// getTaskResult polls go through the shared rate and budget (the store's
// providers row), as res.php polls do: every getTaskResult call the
// simulator received is one the shared budget counted, so several
// instances together never poll harder than one would.
func TestJSONPollsInSharedBudget(t *testing.T) {
	const provider, tasks = "capmonster", 4
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	app := newAppStub(t)
	sim := newJSONSim(t, captchasim.Config{JSONFlavor: captchasim.FlavorAntiCaptcha, DropRate: 1,
		SolveMin: 1500 * time.Millisecond, SolveMax: 2500 * time.Millisecond, Seed: 11})
	dir := t.TempDir()
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	cfg := jsonCaddyfile(dir, logFile, provider, pollBlock("after 1s", "interval 5s"), sim, app, "")
	cfg = strings.Replace(cfg, "storage_dir "+dir, fmt.Sprintf("store postgres {\n\t\t\tdsn %q\n\t\t\tschema %s\n\t\t}", dsn, schema), 1)
	loadCaddyfile(t, cfg)
	t.Cleanup(func() {
		unloadCaddy(t)
		if t.Failed() {
			testkit.LogTail(t, logFile, 60)
		}
	})
	ids := make([]string, tasks)
	for i := range ids {
		ids[i] = createTask(t, provider)
	}
	s := runningApp(t).store(time.Second)
	testkit.WaitFor(t, 30*time.Second, "every polled delivery", func() bool {
		for _, id := range ids {
			rec, err := s.Get(t.Context(), store.Key{Provider: provider, ID: id})
			if err != nil || rec.State != store.StateDelivered {
				return false
			}
		}
		return true
	})
	// Each polled result's history: one forward, source poll. The status
	// shows the shared budget, and no live pingback (every one dropped).
	for _, id := range ids {
		rec, err := s.Get(t.Context(), store.Key{Provider: provider, ID: id})
		if err != nil {
			t.Fatal(err)
		}
		checkHistory(t, rec.History, []attemptWant{{store.SourcePoll, 200, "delivered", ""}})
	}
	status := adminStatus(t)
	if at, ok := status.LastCallbackAt[provider]; ok {
		t.Errorf("status last_callback_at[%s] = %v with every pingback dropped, want none (polled results are not live pingbacks)", provider, at)
	}
	if age := status.OldestUndeliveredAgeSeconds[provider]; age != 0 {
		t.Errorf("status oldest_undelivered_age_seconds[%s] = %v with everything delivered, want 0", provider, age)
	}
	unloadCaddy(t) // no poll after the counts are read
	calls := sim.Stats().GetTaskResultCalls
	if calls < tasks {
		t.Fatalf("the simulator got %d getTaskResult calls for %d polled tasks", calls, tasks)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var polls, tracked int64
	if err := conn.QueryRow(ctx, "SELECT polls, tracked FROM "+pgx.Identifier{schema, "providers"}.Sanitize()+" WHERE provider = $1 AND account = $2", provider, accountID(provider, captchasim.DefaultKey)).
		Scan(&polls, &tracked); err != nil {
		t.Fatalf("reading the shared budget: %v", err)
	}
	if polls != calls || tracked != tasks {
		t.Errorf("shared budget counted %d polls for %d tracked tasks; the provider got %d getTaskResult calls for %d tasks", polls, tracked, calls, tasks)
	}
	if b, want := status.Budget[provider], (adminapi.BudgetStatus{Used: polls, Left: 10*tracked + pollAllowance - polls}); b != want {
		t.Errorf("status budget[%s] = %+v, want the shared row's %+v", provider, b, want)
	}
	acc := status.Accounts[provider][accountID(provider, captchasim.DefaultKey)]
	if acc.Used != polls || acc.Left != 10*tracked+pollAllowance-polls {
		t.Errorf("status accounts[%s] = %+v, want the shared row's budget", provider, acc)
	}
}
