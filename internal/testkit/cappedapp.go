package testkit

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Capacity is what a CappedApp can take and how it turns away the rest.
type Capacity struct {
	// Requests is how many requests the app serves at once (at least 1).
	Requests int
	// Service is how long each served request takes before its 200.
	Service time.Duration
	// Refuse answers a request above the cap, at once.
	Refuse Refusal
	// Key names the result a request carries (a task id), the key of the
	// app's records.
	Key func(r *http.Request) string
}

// Refusal is the answer to a request above a CappedApp's cap, written at
// now: its status, its Retry-After value, and the earliest time that value
// allows the next request (what a client honouring it must wait for).
type Refusal func(now time.Time) (status int, retryAfter string, notBefore time.Time)

// RetryAfterSeconds refuses with status and `Retry-After: <secs>`
// (delta-seconds): the next request is allowed secs seconds after the
// refusal.
func RetryAfterSeconds(status, secs int) Refusal {
	return func(now time.Time) (int, string, time.Time) {
		return status, strconv.Itoa(secs), now.Add(time.Duration(secs) * time.Second)
	}
}

// RetryAfterDate refuses with status and a Retry-After HTTP-date
// (http.TimeFormat) at least ahead of the refusal: now+ahead rounded up to
// the next whole second, since an HTTP-date has no fractions. The next
// request is allowed at that date.
func RetryAfterDate(status int, ahead time.Duration) Refusal {
	return func(now time.Time) (int, string, time.Time) {
		at := now.Add(ahead)
		if t := at.Truncate(time.Second); !t.Equal(at) {
			at = t.Add(time.Second)
		}
		at = at.UTC().Round(0) // a wall-clock time, as the client reads it
		return status, at.Format(http.TimeFormat), at
	}
}

// Exchange is one request a CappedApp received and its answer.
type Exchange struct {
	Arrived  time.Time // when the request arrived
	Answered time.Time // when its answer was written; zero while it is served
	Status   int       // the status answered; 0 while it is served
	// Refused is set on an answer to a request above the cap (Refuse's),
	// and NotBefore is the earliest time it allows the next request.
	Refused   bool
	NotBefore time.Time
	// Cut is set when the client gave up before the answer was written: a
	// 2xx then is no delivery.
	Cut bool
}

// Delivered reports whether the exchange delivered the result: a 2xx
// written while the client still waited.
func (e Exchange) Delivered() bool { return e.Status >= 200 && e.Status < 300 && !e.Cut }

// CappedApp is a stand-in for an application that can serve only so many
// requests at once: a real HTTP server on loopback. Up, it serves at most
// Capacity.Requests at once, each answered 200 after Capacity.Service, and
// answers a request above the cap at once with Capacity.Refuse's status and
// Retry-After. Down (SetDown), it answers every request at once with 503
// and no Retry-After, like a proxy in front of an app that is not there.
// It records every request by its key: when it arrived and was answered,
// the status, and for a refusal the time its Retry-After names.
type CappedApp struct {
	*httptest.Server

	capacity Capacity

	mu          sync.Mutex
	down        bool
	inflight    int // requests being served (up, under the cap)
	maxInflight int
	byKey       map[string][]Exchange // in order of arrival
}

// NewCappedApp starts a CappedApp, up, on an ephemeral loopback port. It is
// closed at test end.
func NewCappedApp(t testing.TB, c Capacity) *CappedApp {
	t.Helper()
	if c.Requests < 1 || c.Refuse == nil || c.Key == nil {
		t.Fatalf("capped app: want at least 1 request at once, a Refuse and a Key; got %+v", c)
	}
	a := &CappedApp{capacity: c, byKey: make(map[string][]Exchange)}
	a.Server = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.Close)
	return a
}

func (a *CappedApp) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	key := a.capacity.Key(r)
	a.mu.Lock()
	now := time.Now()
	i := len(a.byKey[key])
	a.byKey[key] = append(a.byKey[key], Exchange{Arrived: now})
	switch {
	case a.down:
		a.answered(key, i, http.StatusServiceUnavailable, r)
		a.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	case a.inflight >= a.capacity.Requests:
		status, retryAfter, notBefore := a.capacity.Refuse(now)
		a.byKey[key][i].Refused = true
		a.byKey[key][i].NotBefore = notBefore
		a.answered(key, i, status, r)
		a.mu.Unlock()
		w.Header().Set("Retry-After", retryAfter)
		w.WriteHeader(status)
		return
	}
	a.inflight++
	a.maxInflight = max(a.maxInflight, a.inflight)
	a.mu.Unlock()

	select {
	case <-time.After(a.capacity.Service):
	case <-r.Context().Done():
	}
	a.mu.Lock()
	a.inflight--
	a.answered(key, i, http.StatusOK, r)
	a.mu.Unlock()
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "app says hi")
}

// answered records the answer to the i-th request of key; a.mu is held.
func (a *CappedApp) answered(key string, i, status int, r *http.Request) {
	e := &a.byKey[key][i]
	e.Answered = time.Now()
	e.Status = status
	e.Cut = r.Context().Err() != nil
}

// SetDown takes the app down (every request answered 503 at once, no
// Retry-After) or brings it back up, and returns when that happened.
func (a *CappedApp) SetDown(down bool) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = down
	return time.Now()
}

// Count returns how many requests carried key.
func (a *CappedApp) Count(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.byKey[key])
}

// Deliveries returns how many requests carrying key were answered 2xx
// while the client still waited.
func (a *CappedApp) Deliveries(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, e := range a.byKey[key] {
		if e.Delivered() {
			n++
		}
	}
	return n
}

// Exchanges returns a copy of the requests that carried key and their
// answers, in order of arrival.
func (a *CappedApp) Exchanges(key string) []Exchange {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Exchange(nil), a.byKey[key]...)
}

// PeakInflight returns the most requests the app served at once (refusals
// and answers while down not counted); never above Capacity.Requests.
func (a *CappedApp) PeakInflight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxInflight
}
