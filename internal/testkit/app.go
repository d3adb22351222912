package testkit

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Received is a request as the stand-in app received it.
type Received struct {
	Method string
	URI    string // the request URI, as sent
	Host   string
	Header http.Header
	Body   string
	At     time.Time // when it arrived
}

// App is a stand-in for the application behind Caddy: a real HTTP server
// on loopback that records what it receives and answers as told (status
// 200 and the body "app says hi" unless told otherwise). Change its
// behaviour fields with Tune while it serves.
type App struct {
	*httptest.Server

	// KeyHeader is the request header that names a delivery (the
	// idempotency key), for Count, WithKey and Deliveries.
	KeyHeader string

	mu   sync.Mutex
	reqs []Received

	// Status is the answer status; 200 if 0.
	Status int
	// Delay is how long an answer waits before it is written (or until the
	// request is cancelled).
	Delay time.Duration
	// Release, if set, makes answers wait until it is closed (or until the
	// request is cancelled).
	Release chan struct{}
	// StatusFor, if set, picks each answer's status (over Status).
	StatusFor func(r *http.Request) int
	// DelayFor, if set, picks each answer's delay (over Delay).
	DelayFor func(r *http.Request) time.Duration

	// answered counts, by KeyHeader value, the answers below 400 written
	// while the request was still live (Caddy had not cut it): deliveries.
	answered map[string]int
	// inflight counts requests being answered; maxInflight is its peak.
	inflight, maxInflight int
}

// NewApp starts a stand-in app on an ephemeral loopback port; keyHeader
// names the header that carries a delivery's key. It is closed at test end.
func NewApp(t testing.TB, keyHeader string) *App {
	t.Helper()
	a := &App{KeyHeader: keyHeader}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

// NewAppOn is NewApp on a given loopback port (a port from
// UnusedLoopbackPort, for an app that comes back where it was down).
func NewAppOn(t testing.TB, port, keyHeader string) *App {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatalf("app stub on port %s: %v", port, err)
	}
	a := &App{KeyHeader: keyHeader}
	a.Server = httptest.NewUnstartedServer(http.HandlerFunc(a.serve))
	_ = a.Server.Listener.Close()
	a.Server.Listener = ln
	a.Start()
	t.Cleanup(a.Close)
	return a
}

func (a *App) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.reqs = append(a.reqs, Received{Method: r.Method, URI: r.RequestURI, Host: r.Host, Header: r.Header.Clone(), Body: string(body), At: time.Now()})
	status, delay, release, statusFor, delayFor := a.Status, a.Delay, a.Release, a.StatusFor, a.DelayFor
	a.inflight++
	a.maxInflight = max(a.maxInflight, a.inflight)
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.inflight--
		a.mu.Unlock()
	}()
	if statusFor != nil {
		status = statusFor(r)
	}
	if delayFor != nil {
		delay = delayFor(r)
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
		}
	}
	if release != nil {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}
	if status == 0 {
		status = http.StatusOK
	}
	if status < 400 && r.Context().Err() == nil {
		a.mu.Lock()
		if a.answered == nil {
			a.answered = make(map[string]int)
		}
		a.answered[r.Header.Get(a.KeyHeader)]++
		a.mu.Unlock()
	}
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "app says hi")
}

// Tune runs f under the app's lock: f changes the behaviour fields
// (Status, Delay, Release, StatusFor, DelayFor).
func (a *App) Tune(f func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f()
}

// SetStatus makes the app answer with status from now on.
func (a *App) SetStatus(status int) {
	a.Tune(func() { a.Status = status })
}

// Deliveries returns how many times the app answered a request with the
// key with a status below 400 while the client still waited for it.
func (a *App) Deliveries(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.answered[key]
}

// PeakInflight returns the most requests the app was answering at once.
func (a *App) PeakInflight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxInflight
}

// Requests returns a copy of what the app received so far, in order.
func (a *App) Requests() []Received {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Received(nil), a.reqs...)
}

// WithKey returns what the app received with the key, in order.
func (a *App) WithKey(key string) []Received {
	var out []Received
	for _, r := range a.Requests() {
		if r.Header.Get(a.KeyHeader) == key {
			out = append(out, r)
		}
	}
	return out
}

// Count returns how many requests carried the key.
func (a *App) Count(key string) int { return len(a.WithKey(key)) }

// HostPort is the app's address (host:port), for a reverse_proxy upstream.
func (a *App) HostPort() string { return strings.TrimPrefix(a.URL, "http://") }
