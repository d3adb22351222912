// Package sender is what the open-loop senders of the benchmarks
// (bench/loadgen, and bench/crashapp's send) share: an HTTP client that
// keeps a connection per request in flight, and one pingback-shaped POST.
// It decides nothing about rates or schedules; each sender keeps its own.
package sender

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Client is an HTTP client with up to conns connections to one host, all
// kept alive between requests, no compression, dialTimeout to connect and
// timeout for a whole request (0: none).
func Client(conns int, dialTimeout, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: dialTimeout}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		MaxConnsPerHost:     conns,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

// Post sends one form POST to url, id=<prefix><i, 10 digits>&code=<code>,
// built in body (reset first, so that a sender reuses one buffer), and
// reads the answer to its end. It returns the answer's status and nil; 0
// and the error when no answer came; the status and the error when the
// answer's body was cut. The request is not bound to a context: once sent,
// it runs to its answer or the client's timeout.
func Post(client *http.Client, url string, body *bytes.Buffer, prefix string, i int, code string) (int, error) {
	body.Reset()
	fmt.Fprintf(body, "id=%s%010d&code=%s", prefix, i, code)
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader(body.Bytes()))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, err
}
