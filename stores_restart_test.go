package pingback

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestPostgresRestartUnderTraffic: two instances on a private PostgreSQL
// cluster, verify token (the default) on a tracked provider
// (pingback_track in front of the provider simulator, which sends no
// pingback of its own: the test sends each task's pingback, with its
// token, and sees every answer).
// Pingbacks for 300 tracked tasks arrive at 40/s, spread over both
// instances, while the cluster is stopped for a few seconds and started
// again. No pingback is quarantined (least of all `unverified`: what the
// database was doing is no verdict on a pingback); the ones that arrived
// while the database was away are answered 503, not 200; and once the
// database is back every task's result reaches the app exactly once (by
// its pingback, or by polling for the ones answered 503).
func TestPostgresRestartUnderTraffic(t *testing.T) {
	pg := pgtest.StartCluster(t)
	app := newAppStub(t)
	sim := newPollerSim(t, captchasim.Config{Seed: 34, DropRate: 1})
	cl := &pgCluster{dsn: pg.DSN(), schema: "pingback", site: pgPollSite(app, sim)}
	// The first poll is due 10 s after submission: the pingbacks are
	// what delivers most results, polling what recovers the others.
	cl.global = fmt.Sprintf("provider 2captcha {\n\t\t\tendpoint %s\n\t\t\tapi_key %s\n\t\t}\n\t\tpoll {\n\t\t\tafter 10s\n\t\t\tinterval 5s\n\t\t}\n\t\treplay {\n\t\t\tbackoff 100ms 1s\n\t\t}",
		sim.url, captchasim.DefaultKey)
	ins := cl.start(t, 2)

	const tasks = 300
	client := &http.Client{Timeout: 10 * time.Second}
	type pingback struct{ id, url, code string }
	var pbs []pingback
	for range tasks {
		id, err := pollerSubmit(client, ins[0].base()+"/api", captchasim.DefaultKey, "userrecaptcha", true, nil)
		if err != nil {
			t.Fatalf("submitting: %v", err)
		}
		info, ok := sim.Task(id)
		if !ok || !strings.Contains(info.Pingback, "pingback_token=") {
			t.Fatalf("task %s: the provider got pingback URL %q, want one with its token", id, info.Pingback)
		}
		pbs = append(pbs, pingback{id, info.Pingback, info.Code})
	}

	// The traffic: one pingback every 25 ms, four senders, to A and B in
	// turn.
	var (
		mu       sync.Mutex
		answers  = map[string]int{} // key → status
		byStatus = map[int]int{}
		sent     atomic.Int32
		wg       sync.WaitGroup
	)
	queue := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range queue {
				pb := pbs[i]
				u, err := url.Parse(pb.url)
				if err != nil {
					t.Errorf("pingback URL %q: %v", pb.url, err)
					continue
				}
				u.Host = "localhost:" + ins[i%2].port
				status := 0
				resp, err := client.PostForm(u.String(), url.Values{"id": {pb.id}, "code": {pb.code}})
				if err != nil {
					t.Errorf("pingback %s: %v (Caddy must stay up and answer)", pb.id, err)
				} else {
					resp.Body.Close()
					status = resp.StatusCode
				}
				mu.Lock()
				answers["2captcha:"+pb.id] = status
				byStatus[status]++
				mu.Unlock()
				sent.Add(1)
			}
		})
	}
	go func() {
		defer close(queue)
		tick := time.NewTicker(25 * time.Millisecond) // the load's pace, not synchronisation
		defer tick.Stop()
		for i := range pbs {
			<-tick.C
			queue <- i
		}
	}()
	answered := func(n int32) func() bool { return func() bool { return sent.Load() >= n } }

	testkit.WaitFor(t, 30*time.Second, "traffic before the restart", answered(tasks/4))
	stopped := time.Now()
	pg.Stop(t)
	atStop := sent.Load()
	// The outage lasts while 80 more pingbacks (about 2 s of traffic)
	// are answered.
	testkit.WaitFor(t, 30*time.Second, "pingbacks answered while the database is down", answered(atStop+80))
	pg.Start(t)
	t.Logf("database away for %s (pg_ctl stop and start included)", time.Since(stopped).Round(time.Millisecond))
	wg.Wait()

	mu.Lock()
	t.Logf("answers: %v", byStatus)
	if byStatus[http.StatusServiceUnavailable] == 0 {
		t.Error("no pingback answered 503 while the database was down: the outage was not seen")
	}
	for s, n := range byStatus {
		if s != http.StatusOK && s != http.StatusServiceUnavailable {
			t.Errorf("%d pingbacks answered %d, want 200 or 503", n, s)
		}
	}
	mu.Unlock()

	for _, in := range ins {
		for _, r := range in.records(t, store.StateQuarantined) {
			t.Errorf("%s: %s:%s quarantined as %q", in.name, r.Provider, r.ID, r.Quarantine)
		}
	}
	testkit.WaitFor(t, 90*time.Second, "every task's result to reach the app", func() bool {
		for _, pb := range pbs {
			if app.Deliveries("2captcha:"+pb.id) == 0 {
				return false
			}
		}
		return true
	})
	polled := 0
	for _, pb := range pbs {
		key := "2captcha:" + pb.id
		got := app.WithKey(key)
		if len(got) != 1 {
			t.Errorf("%s (answered %d) reached the app %d times, want once", key, answers[key], len(got))
			continue
		}
		switch src, verified := got[0].Header.Get(HeaderSource), got[0].Header.Get(HeaderVerified); {
		case src == "poll":
			polled++
		case verified != VerifyToken:
			t.Errorf("%s delivered from its pingback verified %q, want token", key, verified)
		}
		if !strings.Contains(got[0].Body, "code="+url.QueryEscape(pb.code)) {
			t.Errorf("%s delivered as %q, want code %s", key, got[0].Body, pb.code)
		}
	}
	t.Logf("%d of %d results delivered by polling", polled, tasks)
	// A result whose task read passed and whose insert failed is
	// forwarded without durability, and its task is still polled: said
	// here (the first one per instance and minute) to explain a double.
	for _, in := range ins {
		for _, line := range strings.Split(in.output.String(), "\n") {
			var entry struct {
				Msg, ID string
			}
			if json.Unmarshal([]byte(line), &entry) == nil && strings.Contains(entry.Msg, "forwarding without durability") {
				t.Logf("%s forwarded %s without durability", in.name, entry.ID)
			}
		}
	}
}
