package testkit

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Admin is a client of a Caddy admin endpoint: its address, host:port.
type Admin string

// AdminAnswer is what the admin endpoint answered.
type AdminAnswer struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do sends method path (a path on the endpoint, with its query) with body,
// sent as application/json unless it is empty, and returns the answer. A
// request that gets no answer within 30s (a config load answers once the
// new config runs), or none at all, fails t. Each request has a connection
// of its own: a config load may replace the admin server, and a kept-alive
// connection would go to the old one.
func (a Admin) Do(t testing.TB, method, path, body string) AdminAnswer {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+string(a)+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return AdminAnswer{Status: resp.StatusCode, Header: resp.Header, Body: b}
}
