package pgstore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// retryRecord is a queued record due now, or forwarding under a lease if
// forwarding is set.
func retryRecord(id string, forwarding bool) *store.Record {
	now := time.Now().UTC()
	rec := &store.Record{
		Provider: "2captcha", ID: id, Code: "C", Source: store.SourceCallback, ReceivedAt: now,
		Request:   store.Request{Method: "GET", URI: "/pb?id=" + id + "&code=C", Host: "example.com"},
		Delivery:  store.Delivery{State: store.StateQueued, DueAt: now, UpdatedAt: now},
		ExpiresAt: now.Add(time.Hour),
	}
	if forwarding {
		rec.State, rec.Attempts = store.StateForwarding, 1
		rec.Lease = store.Lease{Until: now.Add(time.Minute)}
	}
	return rec
}

// retryOp is one retried operation of the store: it sets up what it
// needs (before the fault), then runs and checks its result.
type retryOp struct {
	name string // the operation the store's log line names
	prep func(t *testing.T, p *pgstore.Postgres, id string)
	run  func(t *testing.T, p *pgstore.Postgres, id string)
}

var forward = func(d *store.Delivery, lapsed bool) { d.State = store.StateForwarding; d.Attempts++ }

// retryOps are the three retried operations: each must succeed once, on
// the row as it would be had no fault happened.
var retryOps = []retryOp{
	{
		name: "insert",
		prep: func(t *testing.T, p *pgstore.Postgres, id string) {},
		run: func(t *testing.T, p *pgstore.Postgres, id string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the handler's ack_timeout
			defer cancel()
			res, err := p.Insert(ctx, retryRecord(id, true))
			if err != nil {
				t.Fatalf("Insert: %v, want it committed after one retry", err)
			}
			if res.Existing != nil {
				t.Fatalf("Insert = duplicate of %+v, want new (its own row)", res.Existing.Delivery)
			}
		},
	},
	{
		name: "delivery update",
		prep: func(t *testing.T, p *pgstore.Postgres, id string) {
			if _, err := p.Insert(context.Background(), retryRecord(id, true)); err != nil {
				t.Fatal(err)
			}
		},
		run: func(t *testing.T, p *pgstore.Postgres, id string) {
			d, err := p.UpdateDelivery(context.Background(), store.Key{Provider: "2captcha", ID: id}, func(d *store.Delivery) error {
				d.State, d.LastStatus, d.Lease = store.StateDelivered, 200, store.Lease{}
				d.Attempts++
				return nil
			})
			if err != nil {
				t.Fatalf("UpdateDelivery: %v, want it committed after one retry", err)
			}
			if d.Attempts != 2 || d.State != store.StateDelivered {
				t.Fatalf("UpdateDelivery = %d attempts, %s; want 2, delivered (applied once)", d.Attempts, d.State)
			}
		},
	},
	{
		name: "claim",
		prep: func(t *testing.T, p *pgstore.Postgres, id string) {
			if _, err := p.Insert(context.Background(), retryRecord(id, false)); err != nil {
				t.Fatal(err)
			}
		},
		run: func(t *testing.T, p *pgstore.Postgres, id string) {
			got, err := p.Claim(context.Background(), store.ClaimRequest{
				Keys: []store.Key{{Provider: "2captcha", ID: id}}, Limit: 10, Lease: time.Minute, Decide: forward})
			if err != nil {
				t.Fatalf("Claim: %v, want it committed after one retry", err)
			}
			if len(got) != 1 || got[0].Attempts != 1 || got[0].Lease.Owner != p.Owner() {
				t.Fatalf("Claim = %d records (%+v), want the record, attempt 1, leased to this store", len(got), got)
			}
		},
	},
}

// checkStored checks the record of id is stored once, as run left it.
func checkStored(t *testing.T, p *pgstore.Postgres, dsn, schema, id string, attempts int) {
	t.Helper()
	rec, err := p.Get(context.Background(), store.Key{Provider: "2captcha", ID: id})
	if err != nil {
		t.Fatalf("Get after the retry: %v", err)
	}
	if rec.Attempts != attempts {
		t.Errorf("stored attempts = %d, want %d", rec.Attempts, attempts)
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{schema, "records"}.Sanitize()+` WHERE id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d rows of %s, want 1", n, id)
	}
}

// wantLog checks the store logged msg for operation what.
func wantLog(t *testing.T, logs *observer.ObservedLogs, msg, what string) {
	t.Helper()
	for _, e := range logs.FilterMessage(msg).All() {
		if e.ContextMap()["operation"] == what {
			return
		}
	}
	t.Errorf("no log %q for %s; logged: %v", msg, what, logs.All())
}

func withParam(t *testing.T, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// openPGNamed opens a store on schema whose connections carry an
// application_name of their own (for pgtest.Terminate) and whose info
// and higher log lines are observed.
func openPGNamed(t *testing.T, dsn, schema string) (*pgstore.Postgres, *observer.ObservedLogs, string) {
	t.Helper()
	app := pgtest.AppName(t)
	core, logs := observer.New(zapcore.InfoLevel)
	p, err := pgstore.Open(pgstore.Options{DSN: withParam(t, dsn, "application_name", app), Schema: schema, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, logs, app
}

// TestPostgresRetriesAfterTerminatedBackends: an administrator terminates
// every backend of the store (pg_terminate_backend, SQLSTATE 57P01), which
// leaves each pooled connection dead; the next insert, delivery update and
// claim each fail once and succeed on a newly dialled connection.
func TestPostgresRetriesAfterTerminatedBackends(t *testing.T) {
	base := pgtest.DSN(t)
	schema := pgtest.Schema(t, base)
	p, logs, app := openPGNamed(t, base, schema)
	for i, op := range retryOps {
		t.Run(op.name, func(t *testing.T) {
			id := "kill-" + op.name
			op.prep(t, p, id)
			if _, err := p.Insert(context.Background(), retryRecord("warm-"+op.name, false)); err != nil {
				t.Fatal(err)
			}
			if n := pgtest.Terminate(t, base, app); n == 0 {
				t.Fatal("no backend of the store to terminate")
			}
			op.run(t, p, id)
			wantLog(t, logs, "postgres connection lost; retrying once on a new connection", op.name)
			checkStored(t, p, base, schema, id, []int{1, 2, 1}[i])
		})
	}
	if errs := logs.FilterLevelExact(zapcore.ErrorLevel).All(); len(errs) > 0 {
		t.Errorf("error lines logged although every retry succeeded: %v", errs)
	}
}

// TestPostgresInsertRetryWithinDeadline: an insert whose context has no
// time left is not retried; its error is the connection's.
func TestPostgresInsertRetryWithinDeadline(t *testing.T) {
	base := pgtest.DSN(t)
	schema := pgtest.Schema(t, base)
	app := pgtest.AppName(t)
	p := openPG(t, withParam(t, base, "application_name", app), schema)
	if _, err := p.Insert(context.Background(), retryRecord("warm", false)); err != nil {
		t.Fatal(err)
	}
	pgtest.Terminate(t, base, app)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the handler's ack_timeout is over
	if _, err := p.Insert(ctx, retryRecord("late", false)); err == nil {
		t.Fatal("Insert with no time left succeeded on a dead connection: want the connection's error, no retry")
	}
	if _, err := p.Get(context.Background(), store.Key{Provider: "2captcha", ID: "late"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of the insert not retried: %v, want ErrNotFound", err)
	}
}

// pgCancelRequestCode is the code of PostgreSQL's CancelRequest packet
// (https://www.postgresql.org/docs/current/protocol-message-formats.html).
const pgCancelRequestCode = 80877102

// commitDropper is a loopback TCP proxy in front of PostgreSQL that, when
// armed, relays the next client message holding the statement COMMIT to the server and
// then drops the client's connection before the server's answer reaches
// it: the commit lands, the client sees the connection break.
type commitDropper struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	dropped atomic.Int32
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newCommitDropper(t *testing.T, target string) *commitDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &commitDropper{ln: ln, target: target}
	d.wg.Go(d.accept)
	t.Cleanup(func() {
		ln.Close()
		d.mu.Lock()
		for _, c := range d.conns {
			c.Close()
		}
		d.mu.Unlock()
		d.wg.Wait()
	})
	return d
}

func (d *commitDropper) accept() {
	for {
		client, err := d.ln.Accept()
		if err != nil {
			return
		}
		// The first 8 bytes of a connection: the length and code of its
		// startup packet. A cancel request (pgx sends one for a query in
		// flight on a connection it gives up) is not relayed: it could
		// abort the transaction whose COMMIT was just relayed, and this
		// proxy's premise is that the commit lands.
		head := make([]byte, 8)
		if _, err := io.ReadFull(client, head); err != nil {
			client.Close()
			continue
		}
		if binary.BigEndian.Uint32(head[4:]) == pgCancelRequestCode {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", d.target)
		if err != nil {
			client.Close()
			continue
		}
		if _, err := server.Write(head); err != nil {
			client.Close()
			server.Close()
			continue
		}
		d.mu.Lock()
		d.conns = append(d.conns, client, server)
		d.mu.Unlock()
		var cut atomic.Bool
		d.wg.Go(func() { // client to server
			buf := make([]byte, 64<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					// The statement COMMIT, NUL-terminated as in a Query or
					// Parse message (not synchronous_commit, which every
					// write transaction reads).
					drop := d.armed.Load() && bytes.Contains(bytes.ToUpper(buf[:n]), []byte("COMMIT\x00")) && d.armed.CompareAndSwap(true, false)
					if drop {
						cut.Store(true) // before the server can answer
					}
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
					if drop {
						d.dropped.Add(1)
						client.Close()
						return
					}
				}
				if err != nil {
					server.Close()
					return
				}
			}
		})
		d.wg.Go(func() { // server to client; after a cut, drained and dropped
			buf := make([]byte, 64<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 && !cut.Load() {
					if _, werr := client.Write(buf[:n]); werr != nil && !cut.Load() {
						server.Close()
						return
					}
				}
				if err != nil {
					if !errors.Is(err, io.EOF) || !cut.Load() {
						client.Close()
					}
					return
				}
			}
		})
	}
}

// TestPostgresCommitLostOnTheWire: the connection drops after COMMIT was
// sent and the commit landed. The store asks the database whether its
// transaction committed and reports the operation done: an insert is
// new (not a duplicate of its own row, which would skip the forward), an
// update is applied once, a claim returns what it claimed.
func TestPostgresCommitLostOnTheWire(t *testing.T) {
	base := pgtest.DSN(t)
	schema := pgtest.Schema(t, base)
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := newCommitDropper(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	// Statements travel as text with every execution (no statement
	// cache), so that the proxy sees each COMMIT.
	dsn := withParam(t, u.String(), "default_query_exec_mode", "exec")
	core, logs := observer.New(zapcore.InfoLevel)
	p, err := pgstore.Open(pgstore.Options{DSN: dsn, Schema: schema, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	for i, op := range retryOps {
		t.Run(op.name, func(t *testing.T) {
			id := "lost-" + op.name
			op.prep(t, p, id)
			before := proxy.dropped.Load()
			proxy.armed.Store(true)
			op.run(t, p, id)
			proxy.armed.Store(false)
			if proxy.dropped.Load() != before+1 {
				t.Fatal("the proxy dropped no connection after a COMMIT: the case was not tested")
			}
			wantLog(t, logs, "postgres connection lost after COMMIT was sent; the commit landed", op.name)
			checkStored(t, p, base, schema, id, []int{1, 2, 1}[i])
		})
	}
}
