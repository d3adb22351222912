package pingback

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
)

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
	app.statusFor = func(*http.Request) int {
		if appDown.Load() {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	cl := newPGCluster(t, "replay {\n\t\t\tbackoff 100ms 1s\n\t\t\tmax_attempts 100000\n\t\t}", app.hostPort)
	cl.dsn = u.String()
	ins := cl.start(t, 1)
	a := ins[0]
	pid := a.cmd.Process.Pid

	var mu sync.Mutex
	acked := map[string]bool{}
	answered := map[int]int{}
	var phase atomic.Int32 // 0 before, 1 cut with app down, 2 cut with app up, 3 after
	ackedWhileCutDown := 0
	var next atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := next.Add(1)
				ph := phase.Load()
				status, _, err := getWith(client, fmt.Sprintf("%s/cb?id=%d&code=C%d", a.base(), 30000+i, i))
				if err != nil {
					t.Errorf("pingback %d: %v (Caddy must stay up)", i, err)
					return
				}
				mu.Lock()
				answered[status]++
				if status == http.StatusOK {
					acked[fmt.Sprintf("captchaai:%d", 30000+i)] = true
					if ph == 1 && phase.Load() == 1 {
						ackedWhileCutDown++
					}
				}
				mu.Unlock()
				time.Sleep(20 * time.Millisecond) // pacing of the load, not synchronisation
			}
		})
	}
	waitFor(t, 10*time.Second, "traffic before the cut", func() bool { return next.Load() > 20 })

	appDown.Store(true)
	phase.Store(1)
	proxy.cut()
	waitFor(t, 5*time.Second, "the health check to report the store unavailable", func() bool {
		status, _ := get(t, a.base()+"/healthz")
		return status == http.StatusServiceUnavailable
	})
	time.Sleep(5 * time.Second) // the outage's first half: its length is the test's subject
	appDown.Store(false)
	phase.Store(2)
	time.Sleep(5 * time.Second) // the outage's second half
	phase.Store(3)
	proxy.restore()
	waitFor(t, 15*time.Second, "the health check to report the store available", func() bool {
		status, _ := get(t, a.base()+"/healthz")
		return status == http.StatusOK
	})
	waitFor(t, 10*time.Second, "results stored again after the cut", func() bool {
		return next.Load() > 0 && len(a.records(t, store.StateDelivered)) > 20
	})
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("answers: %v; acknowledged while the app and the database were both away: %d", answered, ackedWhileCutDown)
	if ackedWhileCutDown != 0 {
		t.Errorf("%d pingbacks answered 200 while neither the database nor the app could take them", ackedWhileCutDown)
	}
	if answered[http.StatusServiceUnavailable] == 0 {
		t.Error("no pingback answered 503 during the cut; want the commit-failure path")
	}
	// Everything acknowledged reaches the app once: stored ones by replay,
	// unstored ones by their live forward.
	waitFor(t, 30*time.Second, "every acknowledged result to reach the app", func() bool {
		for k := range acked {
			if app.deliveries(k) == 0 {
				return false
			}
		}
		return true
	})
	for k := range acked {
		if d := app.deliveries(k); d != 1 {
			t.Errorf("%s acknowledged and delivered %d times, want once", k, d)
		}
	}
	select {
	case <-a.exited:
		t.Fatalf("Caddy exited: %v", a.state)
	default:
	}
	if a.cmd.Process.Pid != pid {
		t.Error("Caddy was restarted")
	}
}
