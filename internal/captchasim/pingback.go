package captchasim

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// validPingback reports whether raw is an absolute http(s) URL with a host,
// the only kind of pingback address the simulator will call.
func validPingback(raw string) bool {
	if len(raw) > 2048 {
		return false
	}
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	return (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// deliver sends one task's pingback: it waits delay first (LateDelay for a
// late pingback; Close cancels the wait) and then makes sends calls back to
// back (2 for a duplicated pingback). There are no retries: providers
// document none (source: docs/protocols.md §2.1 "Retries", §2.2).
func (s *Sim) deliver(rawURL, id, code string, delay time.Duration, sends int) {
	s.deliverCalls(rawURL, id, delay, sends, func(ctx context.Context) (int, error) {
		return s.callPingback(ctx, rawURL, id, code)
	})
}

// deliverCalls is deliver with the HTTP call given: the legacy form or
// query, or a JSON API callback.
func (s *Sim) deliverCalls(rawURL, id string, delay time.Duration, sends int, call func(context.Context) (int, error)) {
	defer s.pingbacksRun.Done()
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("pingback panicked", "id", id, "panic", v)
		}
	}()
	if delay > 0 {
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-s.closeCh:
			timer.Stop()
			s.cancelled(id)
			return
		}
	}
	for i := range sends {
		if i > 0 {
			select {
			case <-s.closeCh:
				s.cancelled(id)
				return
			default:
			}
		}
		s.sendPingback(rawURL, id, call)
	}
}

// cancelled counts a pingback call Close prevented.
func (s *Sim) cancelled(id string) {
	s.mu.Lock()
	s.st.PingbacksCancelled++
	s.mu.Unlock()
	s.log.Info("pingback cancelled by close", "id", id)
}

// sendPingback makes one pingback call and counts it: Sent always, Failed
// when the call errors or the status is not 2xx.
func (s *Sim) sendPingback(rawURL, id string, call func(context.Context) (int, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.PingbackTimeout)
	defer cancel()
	status, err := call(ctx)
	if err == nil && (status < 200 || status > 299) {
		err = errors.New("non-2xx status")
	}
	s.mu.Lock()
	s.st.PingbacksSent++
	if err != nil {
		s.st.PingbacksFailed++
	}
	s.mu.Unlock()
	if err != nil {
		s.log.Info("pingback failed", "id", id, "url", rawURL, "method", s.cfg.PingbackMethod, "status", status, "error", err)
		return
	}
	s.log.Info("pingback sent", "id", id, "url", rawURL, "method", s.cfg.PingbackMethod, "status", status)
}

// callPingback performs the HTTP call and returns the response status.
// POST sends the form body "id=<id>&code=<code>" (source:
// docs/protocols.md §2.1); GET appends the same pairs to the URL's own
// query, which is kept byte for byte (source: docs/protocols.md §2.2).
func (s *Sim) callPingback(ctx context.Context, rawURL, id, code string) (int, error) {
	form := "id=" + url.QueryEscape(id) + "&code=" + url.QueryEscape(code)
	var req *http.Request
	var err error
	if s.cfg.PingbackMethod == http.MethodGet {
		target, _, _ := strings.Cut(rawURL, "#") // fragments are never sent
		sep := "?"
		if strings.Contains(target, "?") {
			sep = "&"
			if strings.HasSuffix(target, "?") || strings.HasSuffix(target, "&") {
				sep = ""
			}
		}
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, target+sep+form, nil)
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, rawURL, strings.NewReader(form))
		if err == nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	}
	if err != nil {
		return 0, err
	}
	return s.send(req)
}

// send sends a pingback or callback request as the simulator
// (User-Agent: captchasim) and returns the answer's status; the answer's
// body is read (up to 64 KiB) and discarded.
func (s *Sim) send(req *http.Request) (int, error) {
	req.Header.Set("User-Agent", "captchasim")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}
