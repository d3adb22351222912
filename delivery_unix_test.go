//go:build unix

package pingback

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestCrashAfterAckDeliversEachOnce: a child Caddy acknowledges N callbacks
// while the app is down and is then killed with SIGKILL. Every acknowledged
// result is on disk; after a restart with the app back, the app receives
// every one of them, each exactly once, by replay.
//
// Exactly once holds here because the app was down while the first process
// ran: no forward could have reached it, so no delivery can be repeated.
// (A crash while the app is up, between its answer and the commit of the
// outcome, is redelivered at least once; the Idempotency-Key is there for
// that case.)
func TestCrashAfterAckDeliversEachOnce(t *testing.T) {
	const n, workers = 50, 8
	appPort := testkit.UnusedLoopbackPort(t) // the app is down: connections are refused
	dir := t.TempDir()
	caddyfile := childCaddyfile(dir, `replay {
			backoff 50ms 200ms
		}`, childPingbackSite("127.0.0.1:"+appPort))

	first := startChildCaddy(t, caddyfile)

	ids := make(chan string, n)
	for i := range n {
		ids <- fmt.Sprintf("7%04d", i)
	}
	close(ids)
	client := &http.Client{Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for range workers {
		wg.Go(func() {
			for id := range ids {
				status, body, err := getWith(client, childBase+"/cb?id="+id+"&code=TOKEN-"+id)
				if err != nil || status != http.StatusOK || body != "OK" {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("id %s: %d %q %v", id, status, body, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d callbacks not acknowledged with 200 OK: %v", len(failures), n, failures)
	}

	// Kill right after the last acknowledgement.
	ps := first.kill()
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child caddy ended with %v, want killed by SIGKILL", ps)
	}

	// Durable before 200: all N acknowledged results are in the crashed
	// database (inspected on a copy, so the restart below recovers the
	// directory exactly as the crash left it).
	crashCopy := t.TempDir()
	copyTree(t, dir, crashCopy)
	withStore(t, crashCopy, func(st store.Store) {
		states := map[store.State]int{}
		defer func() { t.Logf("states after SIGKILL: %v", states) }()
		for i := range n {
			id := fmt.Sprintf("7%04d", i)
			rec, err := st.Get(context.Background(), store.Key{Provider: "captchaai", ID: id})
			if err != nil {
				t.Errorf("acknowledged result %s not in the store after SIGKILL: %v", id, err)
				continue
			}
			states[rec.State]++
			if rec.State == store.StateDelivered || rec.Code != "TOKEN-"+id {
				t.Errorf("record %s after the crash: state %s, code ok %v; want undelivered with its code", id, rec.State, rec.Code == "TOKEN-"+id)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	// The app comes back, then Caddy restarts on the same storage_dir.
	app := newAppStubOn(t, appPort)
	second := startChildCaddy(t, caddyfile)
	testkit.WaitFor(t, 20*time.Second, "the app to receive all acknowledged results", func() bool {
		seen := map[string]bool{}
		for _, r := range app.Requests() {
			seen[r.Header.Get(HeaderIdempotencyKey)] = true
		}
		return len(seen) == n
	})

	// Stop gracefully (in-flight replays finish), so nothing can reach the
	// app any more, then count.
	second.stop()
	got := map[string]int{}
	for _, r := range app.Requests() {
		got[r.Header.Get(HeaderIdempotencyKey)]++
		if src := r.Header.Get(HeaderSource); src != "replay" {
			t.Errorf("%s arrived with %s %q, want replay", r.Header.Get(HeaderIdempotencyKey), HeaderSource, src)
		}
	}
	for i := range n {
		key := fmt.Sprintf("captchaai:7%04d", i)
		if got[key] != 1 {
			t.Errorf("app received %s %d times, want exactly once", key, got[key])
		}
		delete(got, key)
	}
	if len(got) > 0 {
		t.Errorf("app received unexpected keys: %v", got)
	}

	// Every record is final (delivered): no replay is left to happen.
	withStore(t, dir, func(st store.Store) {
		for i := range n {
			id := fmt.Sprintf("7%04d", i)
			rec, err := st.Get(context.Background(), store.Key{Provider: "captchaai", ID: id})
			if err != nil {
				t.Errorf("record %s: %v", id, err)
				continue
			}
			if rec.State != store.StateDelivered || !rec.DueAt.IsZero() {
				t.Errorf("record %s: state %s due %v, want delivered and not due", id, rec.State, rec.DueAt)
			}
		}
	})
}

// getWith sends a GET with client and returns status and body.
func getWith(client *http.Client, url string) (int, string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// withStore opens the Badger store in dir in this process, runs fn and
// closes it.
func withStore(t *testing.T, dir string, fn func(store.Store)) {
	t.Helper()
	st, err := badgerstore.Open(badgerstore.Options{Dir: dir})
	if err != nil {
		t.Fatalf("opening the store in %s: %v", dir, err)
	}
	defer func() {
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
	}()
	fn(st)
}

// copyTree copies the regular files and directories under src into dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o600)
	})
	if err != nil {
		t.Fatalf("copying %s: %v", src, err)
	}
}

// TestCrashesDuringForwardsDoNotPark: a child Caddy is killed with SIGKILL
// while its forward of a result is in flight, three times in a row, with
// max_attempts 3. A cut forward is no failure: after each restart it is
// replayed within a second, and the result ends delivered, not parked.
func TestCrashesDuringForwardsDoNotPark(t *testing.T) {
	appPort := testkit.UnusedLoopbackPort(t)
	app := newAppStubOn(t, appPort)
	app.Tune(func() {
		app.DelayFor = func(r *http.Request) time.Duration {
			if r.Header.Get(HeaderAttempt) != "4" {
				return time.Hour // hangs until Caddy dies
			}
			return 0
		}
	})
	dir := t.TempDir()
	caddyfile := childCaddyfile(dir, `replay {
			backoff 50ms 200ms
			max_attempts 3
		}`, childPingbackSite("127.0.0.1:"+appPort))
	arrived := func(n int) func() bool { return func() bool { return len(app.Requests()) >= n } }

	// Attempt 1, the live forward: the provider is answered at ack_timeout
	// while the forward hangs.
	child := startChildCaddy(t, caddyfile)
	status, body, err := getWith(&http.Client{Timeout: 10 * time.Second}, childBase+"/cb?id=38001&code=TOKEN")
	if err != nil || status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback: %d %q %v, want 200 OK", status, body, err)
	}
	testkit.WaitFor(t, 5*time.Second, "the live forward to reach the app", arrived(1))
	child.kill()

	// Attempts 2 and 3 are replays cut the same way; attempt 4 answers.
	for attempt := 2; attempt <= 4; attempt++ {
		child = startChildCaddy(t, caddyfile)
		ready := time.Now()
		testkit.WaitFor(t, 5*time.Second, fmt.Sprintf("replay %d to reach the app", attempt), arrived(attempt))
		r := app.Requests()[attempt-1]
		if late := r.At.Sub(ready); late > time.Second {
			t.Errorf("replay %d arrived %s after the restart, want within 1s", attempt, late)
		}
		if r.Header.Get(HeaderAttempt) != fmt.Sprint(attempt) || r.Header.Get(HeaderSource) != "replay" {
			t.Errorf("forward %d: attempt %q source %q", attempt, r.Header.Get(HeaderAttempt), r.Header.Get(HeaderSource))
		}
		if attempt < 4 {
			child.kill()
		}
	}
	testkit.WaitFor(t, 5*time.Second, "the delivery", func() bool { return app.Deliveries("captchaai:38001") == 1 })
	child.stop()

	withStore(t, dir, func(st store.Store) {
		rec, err := st.Get(context.Background(), store.Key{Provider: "captchaai", ID: "38001"})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != store.StateDelivered || rec.Attempts != 4 || rec.Failures != 0 || rec.Interrupts != 0 {
			t.Errorf("after three crashes: %s attempts %d failures %d interrupts %d; want delivered, 4, 0, 0",
				rec.State, rec.Attempts, rec.Failures, rec.Interrupts)
		}
		// The history: each cut attempt found interrupted by the next
		// open, then the delivery.
		checkHistory(t, rec.History, []attemptWant{
			{store.SourceCallback, 0, "interrupted", "interrupted by restart"},
			{store.SourceReplay, 0, "interrupted", "interrupted by restart"},
			{store.SourceReplay, 0, "interrupted", "interrupted by restart"},
			{store.SourceReplay, http.StatusOK, "delivered", ""},
		})
	})
	if n := len(app.Requests()); n != 4 {
		t.Errorf("the app received %d forwards, want 4", n)
	}
}

// TestStopCutsHangingForward: `caddy stop` while a live forward hangs on
// the app exits in about 2 s, not after forward_timeout; the cut forward is
// recorded as interrupted and queued for the next start.
func TestStopCutsHangingForward(t *testing.T) {
	appPort := testkit.UnusedLoopbackPort(t)
	app := newAppStubOn(t, appPort)
	app.Tune(func() { app.Delay = time.Hour })
	dir := t.TempDir()
	child := startChildCaddy(t, childCaddyfile(dir, "", childPingbackSite("127.0.0.1:"+appPort)))
	status, body, err := getWith(&http.Client{Timeout: 10 * time.Second}, childBase+"/cb?id=39001&code=TOKEN")
	if err != nil || status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback: %d %q %v, want 200 OK", status, body, err)
	}
	testkit.WaitFor(t, 5*time.Second, "the forward to reach the app", func() bool { return len(app.Requests()) == 1 })

	start := time.Now()
	child.stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("caddy stop took %s with a hanging forward, want about 2s", took)
	}
	withStore(t, dir, func(st store.Store) {
		rec, err := st.Get(context.Background(), store.Key{Provider: "captchaai", ID: "39001"})
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != store.StateQueued || rec.Interrupts != 0 || rec.Failures != 0 || rec.LastError != errCut.Error() {
			t.Errorf("after the stop: %s interrupts %d failures %d last error %q; want queued, 0, 0, %q",
				rec.State, rec.Interrupts, rec.Failures, rec.LastError, errCut.Error())
		}
		checkHistory(t, rec.History, []attemptWant{{store.SourceCallback, 0, "interrupted", errCut.Error()}})
	})
}
