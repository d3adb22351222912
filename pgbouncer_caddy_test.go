package pingback

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// Several Caddy instances behind PgBouncer with its stock settings (only
// pool_mode, the listen address and auth set), as managed PostgreSQL is
// usually deployed: the same rules as a direct connection, in session and
// in transaction pooling.

// newPgBouncerCluster is newPGCluster with the instances' DSN pointing at
// a PgBouncer of its own in pool mode mode.
func newPgBouncerCluster(t *testing.T, mode, global string, app func() string) (*pgCluster, *pgtest.PgBouncer) {
	t.Helper()
	cl := newPGCluster(t, global, app)
	dsn, bouncer := pgtest.StartPgBouncer(t, cl.dsn, mode)
	cl.dsn = dsn
	return cl, bouncer
}

// noPreparedStatementErrors fails t if an instance logged a prepared
// statement error (what a statement cache behind a transaction pooler
// causes).
func noPreparedStatementErrors(t *testing.T, ins []*pgInstance) {
	t.Helper()
	for _, in := range ins {
		if out := in.output.String(); strings.Contains(out, "prepared statement") {
			t.Errorf("instance %s logged a prepared statement error:\n%s", in.name, out)
		}
	}
}

// TestPgBouncerInstancesShareOneTruth: two instances behind PgBouncer (in
// transaction and in session pooling) start at once on an empty schema;
// 50 concurrent duplicates of one pingback split across them reach the
// app once; 300 pingbacks arrive while the app answers 500, a third
// instance starts meanwhile, and once the app is back each reaches it
// exactly once; no instance logs a prepared statement error.
func TestPgBouncerInstancesShareOneTruth(t *testing.T) {
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) {
			app := newAppStub(t)
			cl, _ := newPgBouncerCluster(t, mode, "replay {\n\t\t\tbackoff 100ms 1s\n\t\t\tmax_attempts 100000\n\t\t}", app.HostPort)
			if mode == "session" {
				// A session holds its server connection for the client
				// connection's life: three instances' pools must fit in
				// PgBouncer's default_pool_size (20), as docs/storage.md
				// says.
				u, err := url.Parse(cl.dsn)
				if err != nil {
					t.Fatal(err)
				}
				q := u.Query()
				q.Set("pool_max_conns", "6")
				u.RawQuery = q.Encode()
				cl.dsn = u.String()
			}
			ins := cl.start(t, 2)

			duplicatesReachAppOnce(t, app, ins)

			var wg sync.WaitGroup
			app.SetStatus(http.StatusInternalServerError)
			const n = 300
			ids := make(chan int)
			client := &http.Client{Timeout: 10 * time.Second}
			for w := range 8 {
				wg.Go(func() {
					for i := range ids {
						status, body, err := getWith(client, fmt.Sprintf("%s/cb?id=%d&code=R%d", ins[(i+w)%2].base(), 20000+i, i))
						if err != nil || status != http.StatusOK || body != "OK" {
							t.Errorf("pingback %d: %d %q %v; want 200 OK (stored while the app answers 500)", i, status, body, err)
						}
					}
				})
			}
			third := cl.instance(t, 2)
			for i := range n {
				if i == n/2 { // a third instance joins while the others take traffic
					third.childCaddy = launchChildCaddy(t, cl.caddyfile(third), third.admin, third.base())
				}
				ids <- i
			}
			close(ids)
			wg.Wait()
			third.waitReady(60 * time.Second)
			ins = append(ins, third)
			app.SetStatus(http.StatusOK)
			testkit.WaitFor(t, 90*time.Second, "every result to be delivered", func() bool {
				return len(ins[2].records(t, store.StateDelivered)) == n+1
			})
			for i := range n {
				key := fmt.Sprintf("captchaai:%d", 20000+i)
				if c := app.Deliveries(key); c != 1 {
					t.Errorf("%s reached the app %d times with 200, want once", key, c)
				}
			}
			t.Logf("deliveries by instance: %v", byInstance(app))
			noPreparedStatementErrors(t, ins)
		})
	}
}

// TestPgBouncerStatementPoolingRefused: behind PgBouncer in statement
// pooling, which cannot run a transaction, Caddy refuses to start with an
// error that names pool_mode.
func TestPgBouncerStatementPoolingRefused(t *testing.T) {
	app := newAppStub(t)
	cl, _ := newPgBouncerCluster(t, "statement", "", app.HostPort)
	in := cl.instance(t, 1)
	in.childCaddy = launchChildCaddy(t, cl.caddyfile(in), in.admin, in.base())
	select {
	case <-in.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("Caddy still runs 60 s after start behind a statement pooler:\n%s", in.output.String())
	}
	if in.state.Success() {
		t.Error("Caddy exited 0 behind a statement pooler")
	}
	if out := in.output.String(); !strings.Contains(out, "pool_mode") {
		t.Errorf("Caddy's output does not name pool_mode:\n%s", out)
	}
}

// TestPgBouncerServerConnectionsKilled: two instances behind PgBouncer in
// transaction pooling take a steady stream of pingbacks while every
// server connection of the pooler is terminated, twice (a failover, an
// administrator's pg_terminate_backend). Caddy stays up, each pingback is
// answered 200 or 503, never anything else, storing goes on after each
// kill, and every pingback answered 200 reaches the app exactly once.
func TestPgBouncerServerConnectionsKilled(t *testing.T) {
	app := newAppStub(t)
	cl, bouncer := newPgBouncerCluster(t, "transaction", "replay {\n\t\t\tbackoff 100ms 1s\n\t\t\tmax_attempts 100000\n\t\t}", app.HostPort)
	ins := cl.start(t, 2)

	load := startPingbackLoad(t, 4, 10*time.Millisecond, func(w int, i int64) string {
		return fmt.Sprintf("%s/cb?id=%d&code=K%d", ins[w%2].base(), 50000+i, i)
	})
	stored := func() int { return len(ins[0].records(t, store.StateDelivered)) }
	for round := range 2 {
		before := stored()
		testkit.WaitFor(t, 20*time.Second, "results stored before the kill", func() bool { return stored() >= before+30 })
		if k := bouncer.KillServerConnections(t); k == 0 {
			t.Fatalf("round %d: the pooler had no server connection to terminate", round)
		}
		after := stored()
		testkit.WaitFor(t, 20*time.Second, "results stored after the kill", func() bool { return stored() >= after+30 })
	}
	answered, acked, _ := load.stop()
	t.Logf("answers: %v", answered)
	for status, c := range answered {
		if status != http.StatusOK && status != http.StatusServiceUnavailable {
			t.Errorf("%d pingbacks answered %d, want only 200 or 503", c, status)
		}
	}
	ackedDeliveredOnce(t, app, acked)
	for _, in := range ins {
		select {
		case <-in.exited:
			t.Errorf("instance %s exited: %v", in.name, in.state)
		default:
		}
	}
	noPreparedStatementErrors(t, ins)
}

// TestLeastPrivilegeInstance: a Caddy process whose DSN is a role that
// owns only a schema a DBA created for it in another database (no CREATE
// right on the database, not a superuser), as docs/storage.md sets it up,
// behind PgBouncer in transaction pooling: it starts, migrates the schema
// and stores and delivers a pingback.
func TestLeastPrivilegeInstance(t *testing.T) {
	lp := pgtest.NewLeastPrivilege(t)
	lp.CreateSchema(t, "pingback")
	app := newAppStub(t)
	dsn, _ := pgtest.StartPgBouncer(t, lp.DSN, "transaction")
	cl := newPGCluster(t, "", app.HostPort)
	cl.dsn, cl.schema = dsn, "pingback"
	in := cl.start(t, 1)[0]
	if status, body, err := getWith(http.DefaultClient, in.base()+"/cb?id=4401&code=LEAST"); err != nil || status != http.StatusOK || body != "OK" {
		t.Fatalf("pingback: %d %q %v, want 200 OK", status, body, err)
	}
	var recs []*store.Record
	testkit.WaitFor(t, 15*time.Second, "the result to be delivered", func() bool {
		recs = in.records(t, store.StateDelivered)
		return len(recs) == 1
	})
	if recs[0].ID != "4401" || recs[0].Code != "LEAST" {
		t.Errorf("stored %s with code %q, want 4401 with LEAST", recs[0].ID, recs[0].Code)
	}
	if n := app.Deliveries("captchaai:4401"); n != 1 {
		t.Errorf("the app received the result %d times, want once", n)
	}
}
