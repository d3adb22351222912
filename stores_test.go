package pingback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/testfs"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestStoreCaddyfile: `store badger|postgres { ... }` adapts to the app's
// store guest module.
func TestStoreCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name, global, want string
	}{
		{"postgres", "store postgres {\n\t\t\tdsn {env.PINGBACK_DSN}\n\t\t}",
			`{"dsn":"{env.PINGBACK_DSN}","module":"postgres"}`},
		{"postgres with every option", "store postgres {\n\t\t\tdsn postgres://u@db:5432/p\n\t\t\tschema pb\n\t\t\tlease_term 20s\n\t\t}",
			`{"dsn":"postgres://u@db:5432/p","lease_term":20000000000,"module":"postgres","schema":"pb"}`},
		{"badger", "store badger {\n\t\t\tdir /srv/pb\n\t\t}", `{"dir":"/srv/pb","module":"badger"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := adaptCaddyfile(t, "{\n\tpingback {\n\t\t"+tc.global+"\n\t}\n}\n")
			var c struct {
				Apps struct {
					Pingback struct {
						Store json.RawMessage `json:"store"`
					} `json:"pingback"`
				} `json:"apps"`
			}
			if err := json.Unmarshal(cfg, &c); err != nil {
				t.Fatal(err)
			}
			if got := string(c.Apps.Pingback.Store); got != tc.want {
				t.Errorf("store = %s, want %s", got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name, global, want string
	}{
		{"unknown store", "store redis", "unknown store 'redis'"},
		{"no store name", "store", "wrong argument count"},
		{"unknown postgres option", "store postgres {\n\t\t\tpassword x\n\t\t}", "unrecognized store postgres option 'password'"},
		{"repeated dsn", "store postgres {\n\t\t\tdsn a\n\t\t\tdsn b\n\t\t}", "store postgres dsn specified more than once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte("{\n\tpingback {\n\t\t"+tc.global+"\n\t}\n}\n"), nil)
			assertErrHas(t, err, tc.want)
		})
	}
}

// TestStoreConfigErrors: what Provision and Validate refuse, for JSON and
// Caddyfile alike; and `caddy validate` never connects to the database.
func TestStoreConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, app string
		want      []string
	}{
		{"storage_dir with store postgres", `{"storage_dir": "/tmp/x", "store": {"module": "postgres", "dsn": "postgres://u@localhost/p"}}`,
			[]string{"storage_dir and store are both set"}},
		{"storage_dir with store badger", `{"storage_dir": "/tmp/x", "store": {"module": "badger", "dir": "/tmp/y"}}`,
			[]string{"storage_dir and store are both set"}},
		{"postgres without dsn", `{"store": {"module": "postgres"}}`, []string{"dsn is required"}},
		{"postgres dsn from an unset variable", `{"store": {"module": "postgres", "dsn": "{env.PINGBACK_TEST_UNSET_DSN}"}}`,
			[]string{"dsn is required", "{env.PINGBACK_TEST_UNSET_DSN}"}},
		{"malformed dsn", `{"store": {"module": "postgres", "dsn": "postgres://u:pw@[::1"}}`, []string{"store postgres"}},
		{"lease_term above 30s", `{"store": {"module": "postgres", "dsn": "postgres://u@localhost/p", "lease_term": "1m"}}`,
			[]string{"lease_term must be within [3s, 30s], got 1m0s"}},
		{"unknown store module", `{"store": {"module": "redis"}}`, []string{"pingback.stores.redis"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cfg caddy.Config
			if err := json.Unmarshal([]byte(`{"apps": {"pingback": `+tc.app+`}}`), &cfg); err != nil {
				t.Fatal(err)
			}
			err := caddy.Validate(&cfg)
			assertErrHas(t, err, tc.want...)
			if err != nil && strings.Contains(err.Error(), ":pw@") {
				t.Errorf("error names the password: %v", err)
			}
		})
	}

	t.Run("validate never connects", func(t *testing.T) {
		dsn := "postgres://pingback:s3cret@127.0.0.1:" + testkit.UnusedLoopbackPort(t) + "/pingback"
		var cfg caddy.Config
		if err := json.Unmarshal([]byte(`{"apps": {"pingback": {"store": {"module": "postgres", "dsn": "`+dsn+`"}}}}`), &cfg); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := caddy.Validate(&cfg); err != nil {
			t.Fatalf("validate of a config whose database is down: %v", err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("validate took %s: it must not try the database", took)
		}
	})
}

// TestStartFailsNamingTheDatabase: a database that stays unreachable fails
// the start after the bounded retry, naming host:port/database and never
// the password; Caddy keeps serving its previous config.
func TestStartFailsNamingTheDatabase(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("captchaai", "", app))
	port := testkit.UnusedLoopbackPort(t)
	cfg := adaptCaddyfile(t, caddyfileFor("", pingbackSite("captchaai", "", app)))
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	apps := m["apps"].(map[string]any)
	pb, _ := apps["pingback"].(map[string]any)
	if pb == nil {
		pb = map[string]any{}
		apps["pingback"] = pb
	}
	delete(pb, "storage_dir")
	pb["store"] = map[string]any{"module": "postgres", "dsn": "postgres://pingback:s3cret@127.0.0.1:" + port + "/pb"}
	cfg, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = caddy.Load(cfg, false)
	took := time.Since(start)
	assertErrHas(t, err, "127.0.0.1:"+port+"/pb", "unreachable")
	if err != nil && strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error names the password: %v", err)
	}
	if took < 9*time.Second || took > 20*time.Second {
		t.Errorf("start gave up after %s, want after the 10s retry", took)
	}
	// A new connection: one kept alive from an earlier test may have
	// been closed by its server meanwhile.
	// A request right after the failed load has been seen dropped now
	// and then (EOF, connection reset), apparently while Caddy rolls the
	// new config back (its servers share the listeners). The previous
	// config must answer 200 within moments.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	testkit.WaitFor(t, 2*time.Second, "the previous config to answer 200 after the failed load", func() bool {
		resp, err := c.Get(testBase + "/cb?id=1&code=X")
		if err != nil {
			t.Logf("previous config after the failed load: %v", err)
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Logf("previous config answers %d after the failed load, want 200", resp.StatusCode)
			return false
		}
		return true
	})
}

// tcpProxy is a loopback TCP proxy the test controls, between Caddy and
// PostgreSQL: cut closes every connection and refuses new ones (the
// database unreachable), restore lets them through again.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.cut()
	})
	return p
}

func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

// track registers c unless the proxy is down.
func (p *tcpProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *tcpProxy) pipe(c net.Conn) {
	if !p.track(c) {
		c.Close()
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil || !p.track(up) {
		c.Close()
		if up != nil {
			up.Close()
		}
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
}

// cut drops every connection and refuses new ones.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// restore accepts connections again.
func (p *tcpProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// TestDatabaseCutUnderTraffic: the database becomes unreachable for 10 s
// (a TCP proxy cut) while pingbacks arrive, then comes back. While it is
// away, results take the commit-failure path: forwarded, 200 only if the
// app took them, else 503; the health check answers 503. When it is back,
// without a Caddy restart, storing resumes and every result that was
// answered 200 reaches the app exactly once.
func TestDatabaseCutUnderTraffic(t *testing.T) {
	dsn := pgtest.DSN(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Skipf("test DSN is not a URL: %v", err)
	}
	proxy := newTCPProxy(t, u.Host)
	u.Host = proxy.addr()
	app := newAppStub(t)
	// During the first half of the cut the app is down too: nothing can
	// then be acknowledged.
	var appDown atomic.Bool
	app.StatusFor = func(*http.Request) int {
		if appDown.Load() {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	cl := newPGCluster(t, "replay {\n\t\t\tbackoff 100ms 1s\n\t\t\tmax_attempts 100000\n\t\t}", app.HostPort)
	cl.dsn = u.String()
	ins := cl.start(t, 1)
	a := ins[0]
	pid := a.cmd.Process.Pid

	// Phases: 0 before, 1 cut with app down, 2 cut with app up, 3 after.
	load := startPingbackLoad(t, 4, 20*time.Millisecond, func(_ int, i int64) string {
		return fmt.Sprintf("%s/cb?id=%d&code=C%d", a.base(), 30000+i, i)
	})
	testkit.WaitFor(t, 10*time.Second, "traffic before the cut", func() bool { return load.sent() > 20 })

	appDown.Store(true)
	proxy.cut()
	load.phase.Store(1) // after the cut: a pingback that started before it may have been stored
	testkit.WaitFor(t, 5*time.Second, "the health check to report the store unavailable", func() bool {
		status, _ := testkit.Get(t, a.base()+"/healthz")
		return status == http.StatusServiceUnavailable
	})
	time.Sleep(5 * time.Second) // the outage's first half: its length is the test's subject
	appDown.Store(false)
	load.phase.Store(2)
	time.Sleep(5 * time.Second) // the outage's second half
	load.phase.Store(3)
	proxy.restore()
	testkit.WaitFor(t, 15*time.Second, "the health check to report the store available", func() bool {
		status, _ := testkit.Get(t, a.base()+"/healthz")
		return status == http.StatusOK
	})
	testkit.WaitFor(t, 10*time.Second, "results stored again after the cut", func() bool {
		return len(a.records(t, store.StateDelivered)) > 20
	})
	answered, acked, ackedIn := load.stop()
	ackedWhileCutDown := ackedIn[1]
	t.Logf("answers: %v; acknowledged while the app and the database were both away: %d", answered, ackedWhileCutDown)
	if ackedWhileCutDown != 0 {
		t.Errorf("%d pingbacks answered 200 while neither the database nor the app could take them", ackedWhileCutDown)
	}
	if answered[http.StatusServiceUnavailable] == 0 {
		t.Error("no pingback answered 503 during the cut; want the commit-failure path")
	}
	// Everything acknowledged reaches the app once: stored ones by replay,
	// unstored ones by their live forward.
	ackedDeliveredOnce(t, app, acked)
	select {
	case <-a.exited:
		t.Fatalf("Caddy exited: %v", a.state)
	default:
	}
	if a.cmd.Process.Pid != pid {
		t.Error("Caddy was restarted")
	}
}

// pingbackLoad is a steady stream of captchaai pingbacks, each with a new
// task id, from a few workers, each pacing its requests, until stopped. It
// counts the answers by status, the keys answered 200, and those answered
// 200 by phase (a phase the test sets: a request counts in a phase when it
// began and ended in it).
type pingbackLoad struct {
	t     *testing.T
	phase atomic.Int32
	next  atomic.Int64
	done  chan struct{}
	wg    sync.WaitGroup

	mu       sync.Mutex
	answered map[int]int
	acked    map[string]bool
	ackedIn  map[int32]int
}

// startPingbackLoad starts workers; worker w sends the load's i-th
// pingback (a captchaai GET whose id parameter is the task id) to
// url(w, i), then waits pace. A transport error fails t: Caddy must stay
// up.
func startPingbackLoad(t *testing.T, workers int, pace time.Duration, url func(w int, i int64) string) *pingbackLoad {
	l := &pingbackLoad{t: t, done: make(chan struct{}), answered: map[int]int{}, acked: map[string]bool{}, ackedIn: map[int32]int{}}
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range workers {
		l.wg.Go(func() {
			for {
				select {
				case <-l.done:
					return
				default:
				}
				i := l.next.Add(1)
				ph := l.phase.Load()
				u := url(w, i)
				status, _, err := getWith(client, u)
				if err != nil {
					t.Errorf("pingback %s: %v (Caddy must stay up)", u, err)
					return
				}
				l.mu.Lock()
				l.answered[status]++
				if status == http.StatusOK {
					l.acked["captchaai:"+urlID(u)] = true
					if ph == l.phase.Load() {
						l.ackedIn[ph]++
					}
				}
				l.mu.Unlock()
				time.Sleep(pace) // pacing of the load, not synchronisation
			}
		})
	}
	return l
}

// sent is how many pingbacks were started.
func (l *pingbackLoad) sent() int64 { return l.next.Load() }

// stop ends the load and returns the answers by status, the keys
// answered 200, and the 200s by phase.
func (l *pingbackLoad) stop() (answered map[int]int, acked map[string]bool, ackedIn map[int32]int) {
	close(l.done)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answered, l.acked, l.ackedIn
}

// urlID is the id query parameter of a pingback URL.
func urlID(u string) string {
	_, q, _ := strings.Cut(u, "?")
	v, _ := url.ParseQuery(q)
	return v.Get("id")
}

// ackedDeliveredOnce waits until every key of acked (results answered
// 200) has reached the app, then fails t for each that reached it more
// than once.
func ackedDeliveredOnce(t *testing.T, app *testkit.App, acked map[string]bool) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, "every acknowledged result to reach the app", func() bool {
		for k := range acked {
			if app.Deliveries(k) == 0 {
				return false
			}
		}
		return true
	})
	for k := range acked {
		if d := app.Deliveries(k); d != 1 {
			t.Errorf("%s acknowledged and delivered %d times, want once", k, d)
		}
	}
}

// TestFullDiskIsAStorageOutage: with the storage directory on a small
// filesystem filled below min_free_space, Caddy stays up; a pingback gets
// 200 only if the app took it, else 503; the availability gauge says 0.
// Once space is freed, new pingbacks are stored and delivered again,
// without a restart, and the result stored before is intact. (Needs root to
// mount the filesystem; skipped otherwise. CI runs as root.)
func TestFullDiskIsAStorageOutage(t *testing.T) {
	fs := testfs.Small(t, badgerstore.DefaultMinFreeSpace+64<<20)
	dir := filepath.Join(fs, "pingback")
	app := newAppStub(t)
	startCaddy(t, "storage_dir "+dir+"\nreplay {\n\tbackoff 20ms 40ms\n}", pingbackSite("captchaai", "ack_timeout 500ms", app))
	a := runningApp(t)
	gauge := func() float64 { return testutil.ToFloat64(a.metrics.storeAvailable) }

	pingback := func(id string) (int, string) {
		t.Helper()
		return testkit.Get(t, testBase+"/cb?id="+id+"&code=TOKEN-"+id)
	}
	stored := func(id string) bool {
		_, err := a.handle.store.Get(context.Background(), store.Key{Provider: "captchaai", ID: id})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("get %s: %v", id, err)
		}
		return err == nil
	}

	if status, body := pingback("37001"); status != http.StatusOK || body != "OK" {
		t.Fatalf("before the disk fills: %d %q, want 200 OK", status, body)
	}
	waitForState(t, 5*time.Second, "captchaai", "37001", store.StateDelivered)

	free := testfs.Fill(t, fs, badgerstore.DefaultMinFreeSpace-16<<20)
	testkit.WaitFor(t, 5*time.Second, "the store to report itself unavailable", func() bool { return !a.handle.store.Available() })
	testkit.WaitFor(t, 5*time.Second, "the gauge to say 0", func() bool { return gauge() == 0 })

	// The app takes it: the provider gets 200, though nothing is stored.
	if status, body := pingback("37002"); status != http.StatusOK || body != "OK" {
		t.Errorf("full disk, app up: %d %q, want 200 OK", status, body)
	}
	if stored("37002") || app.Deliveries("captchaai:37002") != 1 {
		t.Errorf("full disk, app up: stored %v, delivered %d times; want not stored, delivered once", stored("37002"), app.Deliveries("captchaai:37002"))
	}
	// The app refuses it: the provider must try again.
	app.SetStatus(http.StatusServiceUnavailable)
	if status, body := pingback("37003"); status != http.StatusServiceUnavailable || body != "result not stored and not delivered" {
		t.Errorf("full disk, app down: %d %q, want 503 \"result not stored and not delivered\"", status, body)
	}
	if stored("37003") {
		t.Error("full disk: 37003 was stored")
	}
	// Caddy still serves other requests: the admin endpoint answers.
	if status, _ := adminDo(t, http.MethodGet, "/config/", ""); status != http.StatusOK {
		t.Errorf("admin endpoint answered %d during the outage", status)
	}

	app.SetStatus(http.StatusOK)
	free()
	testkit.WaitFor(t, 5*time.Second, "storing to resume", func() bool { return a.handle.store.Available() })
	if status, body := pingback("37004"); status != http.StatusOK || body != "OK" {
		t.Errorf("after freeing space: %d %q, want 200 OK", status, body)
	}
	rec := waitForState(t, 5*time.Second, "captchaai", "37004", store.StateDelivered)
	if rec.Code != "TOKEN-37004" {
		t.Errorf("37004 stored with code %q", rec.Code)
	}
	if rec := getRecord(t, "captchaai", "37001"); rec.State != store.StateDelivered || rec.Code != "TOKEN-37001" {
		t.Errorf("the result stored before the outage: %s %q", rec.State, rec.Code)
	}
	testkit.WaitFor(t, 5*time.Second, "the gauge to say 1", func() bool { return gauge() == 1 })
}

// testLeaseTerm is the PostgreSQL lease term of the multi-instance tests.
const testLeaseTerm = 3 * time.Second

// Several Caddy instances, one PostgreSQL database: child Caddy processes
// on their own ports (the first on the child ports, the others on free
// ones), each with the same pingback config and the same store.
//
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
	// globalFor, if set, gives the extra lines of one instance's pingback
	// block instead of global.
	globalFor func(in *pgInstance) string
}

// caddyfile is the config of one instance.
func (c *pgCluster) caddyfile(in *pgInstance) string {
	global := c.global
	if c.globalFor != nil {
		global = c.globalFor(in)
	}
	return testkit.Globals{
		Admin:       in.admin,
		HTTPPort:    in.port,
		GracePeriod: "1ns",
		Pingback:    fmt.Sprintf("store postgres {\n\tdsn \"%s\"\n\tschema %s\n\tlease_term %s\n}\n%s", c.dsn, c.schema, testLeaseTerm, global),
	}.Caddyfile(c.site(in))
}

// instance describes instance i (0: the child ports; others: free ports).
func (c *pgCluster) instance(t *testing.T, i int) *pgInstance {
	in := &pgInstance{name: string(rune('A' + i)), port: childHTTPPort, admin: childAdmin}
	if i > 0 {
		in.port, in.admin = testkit.UnusedLoopbackPort(t), "localhost:"+testkit.UnusedLoopbackPort(t)
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
	a := testkit.Admin(in.admin).Do(t, http.MethodGet, "/pingback/records?limit=10000&state="+string(state), "")
	var page struct {
		Records []*store.Record `json:"records"`
	}
	if err := json.Unmarshal(a.Body, &page); err != nil {
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
func byInstance(app *testkit.App) map[string]int {
	out := map[string]int{}
	for _, r := range app.Requests() {
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
	cl := newPGCluster(t, "", app.HostPort)
	ins := cl.start(t, 2)
	for _, in := range ins {
		if status, body := testkit.Get(t, in.base()+"/healthz"); status != http.StatusOK || body != "store available\n" {
			t.Errorf("health of %s: %d %q, want 200", in.name, status, body)
		}
	}

	duplicatesReachAppOnce(t, app, ins)
}

// duplicatesReachAppOnce sends 50 concurrent duplicates of one pingback
// (captchaai 777), split across the first two instances: each is answered
// 200 and the app receives the result once.
func duplicatesReachAppOnce(t *testing.T, app *testkit.App, ins []*pgInstance) {
	t.Helper()
	const dups = 50
	var wg sync.WaitGroup
	start := make(chan struct{})
	statuses := make([]int, dups)
	for i := range dups {
		wg.Go(func() {
			<-start
			status, _, err := getWith(http.DefaultClient, ins[i%2].base()+"/cb?id=777&code=SAME")
			if err != nil {
				t.Errorf("duplicate %d: %v", i, err)
			}
			statuses[i] = status
		})
	}
	close(start)
	wg.Wait()
	for i, s := range statuses {
		if s != http.StatusOK {
			t.Errorf("duplicate %d via %s answered %d, want 200", i, ins[i%2].name, s)
		}
	}
	testkit.WaitFor(t, 15*time.Second, "the result to be delivered", func() bool {
		return len(ins[1].records(t, store.StateDelivered)) == 1
	})
	if n := app.Count("captchaai:777"); n != 1 {
		t.Errorf("the app received the result %d times from 50 duplicates on two instances, want once", n)
	}
}

// TestInstancesShareTheReplays: 500 pingbacks with the app down, spread over
// two instances; the app comes back: each is delivered once, and each
// instance delivers some of them.
func TestInstancesShareTheReplays(t *testing.T) {
	port := testkit.UnusedLoopbackPort(t)
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
	testkit.WaitFor(t, 90*time.Second, "every result to be delivered", func() bool {
		return len(ins[0].records(t, store.StateDelivered)) == n
	})
	for i := range n {
		key := fmt.Sprintf("captchaai:%d", 10000+i)
		if c := app.Count(key); c != 1 {
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
	cl.site = pgPollSite(app, sim)
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
	testkit.WaitFor(t, deadline+10*time.Second, "B to deliver every polled result", func() bool {
		for _, id := range ids {
			if app.Deliveries("2captcha:"+id) == 0 {
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
		if n := app.Count(key); n != 1 {
			t.Errorf("%s reached the app %d times, want once", key, n)
		}
		if n := sim.callsFor(id); n > 10 {
			t.Errorf("task %s cost %d res.php requests, over the per-task budget of 10", id, n)
		}
	}
	for _, r := range app.Requests() {
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
	app.DelayFor = func(r *http.Request) time.Duration {
		if hang.Load() && r.Header.Get("X-Instance") == "A" {
			select { // A's forwards hang until A is dead
			case <-release:
			case <-r.Context().Done():
			}
		}
		return 0
	}
	cl := newPGCluster(t, "replay {\n\t\t\tbackoff 100ms 1s\n\t\t}", app.HostPort)
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
	testkit.WaitFor(t, testLeaseTerm+15*time.Second, "B to deliver every result A held", func() bool {
		return len(b.records(t, store.StateDelivered)) == n
	})
	if took := time.Since(killed); took > testLeaseTerm+5*time.Second {
		t.Errorf("B took over after %s, want within the lease term %s (+5s)", took, testLeaseTerm)
	}
	for i := range n {
		key := fmt.Sprintf("captchaai:%d", 20000+i)
		if d := app.Deliveries(key); d != 1 {
			t.Errorf("%s delivered %d times, want once", key, d)
		}
	}
	for _, r := range b.records(t, store.StateDelivered) {
		if r.Attempts < 2 {
			t.Errorf("%s: attempts %d; want A's cut forward and B's", r.Key(), r.Attempts)
		}
	}
}

// TestTerminatedBackendsUnderTraffic: pingbacks at 20/s to the in-process
// Caddy on the PostgreSQL store (a third of them refused by the app once,
// so the replay loop claims them), and the plugin's backends terminated
// twice by an administrator (pg_terminate_backend, SQLSTATE 57P01) while
// the database stays up. The store retries on a new connection: every
// pingback answered 200 has its record, none counts as store_error, and
// nothing is logged at error level (inserts, outcomes and the replay
// loop's claims all recovered by their retry).
func TestTerminatedBackendsUnderTraffic(t *testing.T) {
	base := pgtest.DSN(t)
	schema := pgtest.Schema(t, base)
	appName := pgtest.AppName(t)
	u, err := url.Parse(base)
	if err != nil {
		t.Skipf("test DSN is not a URL: %v", err)
	}
	q := u.Query()
	q.Set("application_name", appName)
	u.RawQuery = q.Encode()
	app := newAppStub(t)
	var refused sync.Map // keys refused once
	app.StatusFor = func(r *http.Request) int {
		key := r.Header.Get(HeaderIdempotencyKey)
		n, _ := strconv.Atoi(strings.TrimPrefix(key, "captchaai:"))
		if _, again := refused.LoadOrStore(key, true); n%3 == 0 && !again {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	g := testGlobals(fmt.Sprintf("store postgres {\n\t\t\tdsn %q\n\t\t\tschema %s\n\t\t}\n\t\treplay {\n\t\t\tbackoff 100ms 1s\n\t\t}", u.String(), schema))
	g.LogFile = logFile
	loadCaddyfile(t, g.Caddyfile(pingbackSite("captchaai", "", app)))
	t.Cleanup(func() {
		unloadCaddy(t)
		if t.Failed() {
			testkit.LogTail(t, logFile, 80)
		}
	})
	const storeErrors = `caddy_pingback_callbacks_total{provider="captchaai",result="store_error"}`
	errorsBefore, _ := scrapeMetric(t, storeErrors)

	var (
		mu       sync.Mutex
		answered = map[int]int{}
		acked    []string
		wg       sync.WaitGroup
		sent     atomic.Int64
	)
	client := &http.Client{Timeout: 10 * time.Second}
	stop := make(chan struct{})
	traffic := make(chan struct{})
	go func() {
		defer close(traffic)
		tick := time.NewTicker(50 * time.Millisecond) // 20 pingbacks a second: the load's pace
		defer tick.Stop()
		for i := 1; ; i++ {
			select {
			case <-stop:
				wg.Wait()
				return
			case <-tick.C:
			}
			id := strconv.Itoa(40000 + i)
			sent.Add(1)
			wg.Go(func() {
				status, _, err := getWith(client, testBase+"/cb?id="+id+"&code=C"+id)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("pingback %s: %v (Caddy must stay up)", id, err)
					return
				}
				answered[status]++
				if status == http.StatusOK {
					acked = append(acked, id)
				}
			})
		}
	}()
	killed := 0
	for round, after := range []int64{20, 60} { // the kills, 2 s apart at 20/s
		testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("traffic before kill %d", round+1), func() bool { return sent.Load() >= after })
		killed += pgtest.Terminate(t, base, appName)
	}
	testkit.WaitFor(t, 10*time.Second, "traffic after the kills", func() bool { return sent.Load() >= 100 })
	close(stop)
	<-traffic
	if killed == 0 {
		t.Fatal("no backend of the plugin terminated: the case was not tested")
	}

	s := runningApp(t).store(time.Second)
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d pingbacks, answers %v, %d backends terminated", sent.Load(), answered, killed)
	if answered[http.StatusOK] != int(sent.Load()) {
		t.Errorf("answers %v; want every one of the %d pingbacks 200 (the database was up)", answered, sent.Load())
	}
	for _, id := range acked {
		if _, err := s.Get(t.Context(), store.Key{Provider: "captchaai", ID: id}); err != nil {
			t.Errorf("pingback %s answered 200 but not stored: %v", id, err)
		}
	}
	if v, _ := scrapeMetric(t, storeErrors); v != errorsBefore {
		t.Errorf("store_error went from %v to %v; want no pingback unstored while the database is up", errorsBefore, v)
	}
	// Every refused one is replayed (claimed after the kills too).
	testkit.WaitFor(t, 20*time.Second, "every result delivered", func() bool {
		for _, id := range acked {
			if rec, err := s.Get(t.Context(), store.Key{Provider: "captchaai", ID: id}); err != nil || rec.State != store.StateDelivered {
				return false
			}
		}
		return true
	})
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	retried := map[string]int{}
	for line := range strings.Lines(string(logs)) {
		var e struct{ Level, Msg, Operation string }
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		if e.Level == "error" {
			t.Errorf("logged at error level although every operation recovered: %s", line)
		}
		if e.Msg == "postgres connection lost; retrying once on a new connection" {
			retried[e.Operation]++
		}
	}
	// The first operation after a kill meets a dead connection and resets
	// the pool; the others then dial new ones.
	t.Logf("retries by operation: %v", retried)
	if len(retried) == 0 {
		t.Error("no operation was retried: the kills did not meet the store")
	}
}

// pgPollSite is the site of each instance of a polling test: the pingback
// route in front of app (the instance's name in X-Instance) and
// pingback_track in front of sim, giving the first instance's pingback URL
// (instance A starts first: its port is known to every later one).
func pgPollSite(app *testkit.App, sim *pollerSim) func(in *pgInstance) string {
	var aPort string
	return func(in *pgInstance) string {
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
`, in.port, app.HostPort(), in.name, aPort, sim.hostPort)
	}
}
