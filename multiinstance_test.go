package pingback

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
)

// Several Caddy instances, one PostgreSQL database: child Caddy processes
// on their own ports (the first on the child ports, the others on free
// ones), each with the same pingback config and the same store.

// testLeaseTerm is the PostgreSQL lease term of the multi-instance tests.
const testLeaseTerm = 3 * time.Second

// pgInstance is one child Caddy of a multi-instance test.
type pgInstance struct {
	*childCaddy
	name  string // X-Instance, as the app sees it
	port  string // HTTP port
	admin string // admin host:port
}

// pgCluster describes the instances of a test.
type pgCluster struct {
	dsn    string
	schema string
	global string                      // extra lines of the pingback block
	site   func(in *pgInstance) string // the sites of one instance
}

// caddyfile is the config of one instance.
func (c *pgCluster) caddyfile(in *pgInstance) string {
	return fmt.Sprintf(`{
	admin %s
	http_port %s
	auto_https off
	skip_install_trust
	persist_config off
	grace_period 1ns
	pingback {
		store postgres {
			dsn "%s"
			schema %s
			lease_term %s
		}
		%s
	}
}
%s
`, in.admin, in.port, c.dsn, c.schema, testLeaseTerm, c.global, c.site(in))
}

// instance describes instance i (0: the child ports; others: free ports).
func (c *pgCluster) instance(t *testing.T, i int) *pgInstance {
	in := &pgInstance{name: string(rune('A' + i)), port: childHTTPPort, admin: childAdmin}
	if i > 0 {
		in.port, in.admin = unusedLoopbackPort(t), "localhost:"+unusedLoopbackPort(t)
	}
	return in
}

// start launches the instances all at once (they migrate the empty schema
// at the same moment) and waits until each serves.
func (c *pgCluster) start(t *testing.T, n int) []*pgInstance {
	t.Helper()
	ins := make([]*pgInstance, n)
	for i := range ins {
		ins[i] = c.instance(t, i)
	}
	for _, in := range ins {
		in.childCaddy = launchChildCaddy(t, c.caddyfile(in), in.admin, "http://localhost:"+in.port)
	}
	for _, in := range ins {
		in.waitReady(60 * time.Second)
	}
	return ins
}

func (in *pgInstance) base() string { return "http://localhost:" + in.port }

// records lists the instance's view of the store (admin API).
func (in *pgInstance) records(t *testing.T, state store.State) []*store.Record {
	t.Helper()
	resp, err := http.Get("http://" + in.admin + "/pingback/records?limit=10000&state=" + string(state))
	if err != nil {
		t.Fatalf("listing records on %s: %v", in.name, err)
	}
	defer resp.Body.Close()
	var page struct {
		Records []*store.Record `json:"records"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		t.Fatalf("decoding records of %s: %v", in.name, err)
	}
	return page.Records
}

// newPGCluster is a cluster on a fresh schema of the test database, with
// one pingback route (captchaai, /cb) in front of app on every instance.
func newPGCluster(t *testing.T, global string, app func() string) *pgCluster {
	dsn := pgtest.DSN(t)
	return &pgCluster{dsn: dsn, schema: pgtest.Schema(t, dsn), global: global, site: func(in *pgInstance) string {
		return fmt.Sprintf(`http://localhost:%s {
	handle /cb {
		pingback {
			provider captchaai
		}
		reverse_proxy %s {
			header_up X-Instance %s
		}
	}
	handle /healthz {
		pingback_health
	}
	respond 404
}
`, in.port, app(), in.name)
	}}
}

// byInstance counts the app's requests of key per instance.
func byInstance(app *appStub) map[string]int {
	out := map[string]int{}
	for _, r := range app.requests() {
		out[r.Header.Get("X-Instance")]++
	}
	return out
}

// TestInstancesShareOneTruth: two instances started at the same moment on
// an empty database (both migrate it); 50 concurrent duplicates of one
// pingback split across them reach the app once; and the health check
// answers 200 on both.
func TestInstancesShareOneTruth(t *testing.T) {
	app := newAppStub(t)
	cl := newPGCluster(t, "", app.hostPort)
	ins := cl.start(t, 2)
	for _, in := range ins {
		if status, body := get(t, in.base()+"/healthz"); status != http.StatusOK || body != "store available\n" {
			t.Errorf("health of %s: %d %q, want 200", in.name, status, body)
		}
	}

	const dups = 50
	var wg sync.WaitGroup
	start := make(chan struct{})
	statuses := make([]int, dups)
	for i := range dups {
		wg.Go(func() {
			<-start
			resp, err := http.Get(ins[i%2].base() + "/cb?id=777&code=SAME")
			if err != nil {
				t.Errorf("pingback %d: %v", i, err)
				return
			}
			resp.Body.Close()
			statuses[i] = resp.StatusCode
		})
	}
	close(start)
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Errorf("duplicate %d via %s answered %d, want 200", i, ins[i%2].name, s)
		}
	}
	waitFor(t, 15*time.Second, "the result to be delivered", func() bool {
		recs := ins[1].records(t, store.StateDelivered)
		return len(recs) == 1
	})
	if n := app.count("captchaai:777"); n != 1 {
		t.Errorf("the app received the result %d times from 50 duplicates on two instances, want once", n)
	}
}

// TestInstancesShareTheReplays: 500 pingbacks with the app down, spread over
// two instances; the app comes back: each is delivered once, and each
// instance delivers some of them.
func TestInstancesShareTheReplays(t *testing.T) {
	port := unusedLoopbackPort(t)
	cl := newPGCluster(t, "replay {\n\t\t\tbackoff 100ms 1s\n\t\t\tmax_attempts 100000\n\t\t}", func() string { return "127.0.0.1:" + port })
	ins := cl.start(t, 2)

	const n = 500
	ids := make(chan int)
	var wg sync.WaitGroup
	var bad atomic.Int64
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 16 {
		wg.Go(func() {
			for i := range ids {
				status, body, err := getWith(client, fmt.Sprintf("%s/cb?id=%d&code=R%d", ins[(i+w)%2].base(), 10000+i, i))
				if err != nil || status != http.StatusOK || body != "OK" {
					bad.Add(1)
					t.Errorf("pingback %d: %d %q %v; want 200 OK (stored while the app is down)", i, status, body, err)
				}
			}
		})
	}
	for i := range n {
		ids <- i
	}
	close(ids)
	wg.Wait()
	if bad.Load() > 0 {
		t.FailNow()
	}

	app := newAppStubOn(t, port)
	waitFor(t, 90*time.Second, "every result to be delivered", func() bool {
		return len(ins[0].records(t, store.StateDelivered)) == n
	})
	for i := range n {
		key := fmt.Sprintf("captchaai:%d", 10000+i)
		if c := app.count(key); c != 1 {
			t.Errorf("%s reached the app %d times, want once", key, c)
		}
	}
	per := byInstance(app)
	t.Logf("deliveries by instance: %v", per)
	for _, in := range ins {
		if per[in.name] == 0 {
			t.Errorf("instance %s delivered none of the %d results; want both to share the replays (%v)", in.name, n, per)
		}
	}
}

// TestInstanceKilledPollingTakenOver: tasks are tracked on instance A, A is
// SIGKILLed, the provider drops every pingback: B polls res.php and
// delivers each result once, within the lease plus one poll interval, and
// no task costs more res.php requests than one instance's budget allows.
func TestInstanceKilledPollingTakenOver(t *testing.T) {
	dsn := pgtest.DSN(t)
	app := newAppStub(t)
	sim := newPollerSim(t, captchasim.Config{Seed: 31, DropRate: 1, SolveMin: 200 * time.Millisecond, SolveMax: time.Second})
	cl := &pgCluster{dsn: dsn, schema: pgtest.Schema(t, dsn)}
	const interval = 5 * time.Second
	cl.global = fmt.Sprintf("provider 2captcha {\n\t\t\tendpoint %s\n\t\t\tapi_key %s\n\t\t}\n\t\tpoll {\n\t\t\tafter 1s\n\t\t\tinterval %s\n\t\t}",
		sim.url, captchasim.DefaultKey, interval)
	var aPort string
	cl.site = func(in *pgInstance) string {
		if in.name == "A" {
			aPort = in.port
		}
		return fmt.Sprintf(`http://localhost:%[1]s {
	handle /cb/2captcha {
		pingback {
			provider 2captcha
		}
		reverse_proxy %[2]s {
			header_up X-Instance %[3]s
		}
	}
	handle /api/* {
		pingback_track {
			provider 2captcha
			pingback_url http://localhost:%[4]s/cb/2captcha
		}
		reverse_proxy %[5]s
	}
	respond 404
}
`, in.port, app.hostPort(), in.name, aPort, sim.hostPort)
	}
	ins := cl.start(t, 2)
	a, b := ins[0], ins[1]

	const tasks = 8
	client := &http.Client{Timeout: 10 * time.Second}
	var ids []string
	for range tasks {
		id, err := pollerSubmit(client, a.base()+"/api", captchasim.DefaultKey, "userrecaptcha", true, url.Values{"googlekey": {"k"}, "pageurl": {"https://a.example"}})
		if err != nil {
			t.Fatalf("submitting through A: %v", err)
		}
		ids = append(ids, id)
	}
	a.kill()
	killed := time.Now()

	deadline := testLeaseTerm + interval + pollSlack
	waitFor(t, deadline+10*time.Second, "B to deliver every polled result", func() bool {
		for _, id := range ids {
			if app.deliveries("2captcha:"+id) == 0 {
				return false
			}
		}
		return true
	})
	if took := time.Since(killed); took > deadline {
		t.Errorf("B delivered the last result %s after A was killed, want within lease %s + interval %s + %s slack", took.Round(time.Millisecond), testLeaseTerm, interval, pollSlack)
	}
	for _, id := range ids {
		key := "2captcha:" + id
		if n := app.count(key); n != 1 {
			t.Errorf("%s reached the app %d times, want once", key, n)
		}
		if n := sim.callsFor(id); n > 10 {
			t.Errorf("task %s cost %d res.php requests, over the per-task budget of 10", id, n)
		}
	}
	for _, r := range app.requests() {
		if r.Header.Get("X-Instance") != "B" || r.Header.Get(HeaderSource) != "poll" {
			t.Errorf("app got %s from instance %q, source %q; want polled results from B", r.Header.Get(HeaderIdempotencyKey), r.Header.Get("X-Instance"), r.Header.Get(HeaderSource))
		}
	}
	_ = b
}

// TestInstanceKilledReplaysTakenOver: instance A takes results while the app
// hangs; A is SIGKILLed with forwards in flight; B takes over A's leases
// when they lapse and delivers each result once.
func TestInstanceKilledReplaysTakenOver(t *testing.T) {
	app := newAppStub(t)
	var hang atomic.Bool
	hang.Store(true)
	release := make(chan struct{})
	var releaseOnce sync.Once
	unhang := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(unhang) // before the app stub closes
	app.delayFor = func(r *http.Request) time.Duration {
		if hang.Load() && r.Header.Get("X-Instance") == "A" {
			select { // A's forwards hang until A is dead
			case <-release:
			case <-r.Context().Done():
			}
		}
		return 0
	}
	cl := newPGCluster(t, "replay {\n\t\t\tbackoff 100ms 1s\n\t\t}", app.hostPort)
	ins := cl.start(t, 2)
	a, b := ins[0], ins[1]
	const n = 20
	// A new connection each: the handler of an answered pingback still
	// holds its connection while the forward hangs.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			// ack_timeout answers the provider while the forward hangs.
			status, _, err := getWith(client, fmt.Sprintf("%s/cb?id=%d&code=K", a.base(), 20000+i))
			if err != nil || status != http.StatusOK {
				t.Errorf("pingback %d on A: %d %v", i, status, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	a.kill()
	killed := time.Now()
	// A's hung forwards end when the app sees their connections close
	// (not released: a handler released before it noticed would answer
	// a dead connection, and count as a delivery A never saw).
	hang.Store(false)
	waitFor(t, testLeaseTerm+15*time.Second, "B to deliver every result A held", func() bool {
		return len(b.records(t, store.StateDelivered)) == n
	})
	if took := time.Since(killed); took > testLeaseTerm+5*time.Second {
		t.Errorf("B took over after %s, want within the lease term %s (+5s)", took, testLeaseTerm)
	}
	for i := range n {
		key := fmt.Sprintf("captchaai:%d", 20000+i)
		if d := app.deliveries(key); d != 1 {
			t.Errorf("%s delivered %d times, want once", key, d)
		}
	}
	for _, r := range b.records(t, store.StateDelivered) {
		if r.Attempts < 2 {
			t.Errorf("%s: attempts %d; want A's cut forward and B's", r.Key(), r.Attempts)
		}
	}
}
