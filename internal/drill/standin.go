package drill

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// standinMode is how the drill's stand-in app answers.
type standinMode int

const (
	standinUp      standinMode = iota // 200
	standinRefused                    // listener closed: connection refused
	standin503                        // 503
	standinSlow                       // 200 after delay
)

// standin is the app the drill puts behind every pingback route: it answers
// as its mode says and counts, per Idempotency-Key, the deliveries it
// accepted (answered 2xx).
type standin struct {
	addr string
	drop bool // a broken app for the drill's own tests: every request's connection is closed unanswered
	// upstreams are the app's own (--app): a delivery is forwarded to the
	// one its drillUpstreamHeader names and counts if the app answers 2xx.
	upstreams []*httputil.ReverseProxy

	mu       sync.Mutex
	mode     standinMode
	delay    time.Duration
	ln       net.Listener
	srv      *http.Server
	got      map[string]int       // accepted deliveries per Idempotency-Key
	first    map[string]time.Time // first accepted delivery per key
	seen     map[string]int       // requests per key, whatever the answer
	drillHdr map[string]bool      // X-Pingback-Drill: 1 was on the request
}

// forwardTo makes the stand-in pass deliveries on to the app's own
// upstreams (base URLs) instead of answering them itself.
func (s *standin) forwardTo(upstreams []string) error {
	for _, u := range upstreams {
		pu, err := url.Parse(u)
		if err != nil || pu.Host == "" {
			return fmt.Errorf("app upstream %q: not an address the drill can reach", u)
		}
		rp := httputil.NewSingleHostReverseProxy(pu)
		s.upstreams = append(s.upstreams, rp)
	}
	return nil
}

func newStandin(drop bool) (*standin, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &standin{addr: ln.Addr().String(), drop: drop, got: map[string]int{}, first: map[string]time.Time{},
		seen: map[string]int{}, drillHdr: map[string]bool{}}
	s.serve(ln)
	return s, nil
}

func (s *standin) serve(ln net.Listener) {
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func(srv *http.Server) { _ = srv.Serve(ln) }(s.srv)
}

// setMode changes how the stand-in answers; refused closes its listener,
// leaving it reopens it on the same port.
func (s *standin) setMode(m standinMode, delay time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := s.mode
	s.mode, s.delay = m, delay
	switch {
	case m == standinRefused && was != standinRefused:
		return s.srv.Close()
	case m != standinRefused && was == standinRefused:
		var ln net.Listener
		var err error
		for range 50 { // the port was ours a moment ago
			if ln, err = net.Listen("tcp", s.addr); err == nil {
				s.serve(ln)
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		return err
	}
	return nil
}

func (s *standin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body = io.NopCloser(bytes.NewReader(body))
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	mode, delay, drop := s.mode, s.delay, s.drop
	s.seen[key]++
	if r.Header.Get("X-Pingback-Drill") == "1" {
		s.drillHdr[key] = true
	}
	s.mu.Unlock()
	if drop {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				_ = c.Close()
				return
			}
		}
		panic(http.ErrAbortHandler)
	}
	switch mode {
	case standin503:
		http.Error(w, "drill: app down", http.StatusServiceUnavailable)
		return
	case standinSlow:
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return // the forward gave up: not accepted
		}
	}
	if n, err := strconv.Atoi(r.Header.Get(drillUpstreamHeader)); err == nil && n >= 0 && n < len(s.upstreams) {
		r.Header.Del(drillUpstreamHeader)
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		s.upstreams[n].ServeHTTP(rec, r)
		if rec.status < 200 || rec.status > 299 {
			return
		}
		s.accept(key)
		return
	}
	s.accept(key)
	_, _ = io.WriteString(w, "drill app received "+key)
}

// statusRecorder keeps the status the app answered.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// accept counts an accepted delivery of key.
func (s *standin) accept(key string) {
	s.mu.Lock()
	s.got[key]++
	if _, ok := s.first[key]; !ok {
		s.first[key] = time.Now()
	}
	s.mu.Unlock()
}

// count returns the accepted deliveries of key and when the first came.
func (s *standin) count(key string) (int, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[key], s.first[key]
}

// requests returns how many requests for key reached the stand-in.
func (s *standin) requests(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[key]
}

func (s *standin) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == standinRefused {
		return nil
	}
	err := s.srv.Close()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
