// Package providerclient holds the HTTP clients that ask a captcha-solving
// provider for a task's result: ResPHP calls the legacy res.php API
// (action=get), TaskResult the JSON getTaskResult API. Like Caddy's
// fcgiclient it imports nothing of Caddy nor of the plugin: a client is an
// endpoint, an API key and an *http.Client, and a call returns the
// classified answer or an error.
//
// internal/protocol holds the wire formats and parses them, free of I/O;
// this package does the I/O and uses protocol to build the requests and to
// parse the answers. What the caller does with an answer (rate limits,
// budgets, back-off, delivery) is not its concern.
//
// Errors never carry the API key: a transport error that quotes a URL with
// the key has it replaced by REDACTED.
package providerclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// MaxAnswer is the most of an answer's body a client reads, in bytes
// (1 MiB); a longer answer is cut there and then fails to parse.
const MaxAnswer = 1 << 20

// newRequest builds a request to a provider's API, the one builder of every
// client here: http.MethodGet of target (the parameters in its query; body
// and contentType unused), or http.MethodPost of body with the
// Content-Type contentType.
func newRequest(ctx context.Context, method, target string, body []byte, contentType string) (*http.Request, error) {
	if method == http.MethodGet {
		return http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", contentType)
	return req, nil
}

// do sends req with hc and returns the body of a 200 answer (at most
// MaxAnswer bytes). A transport error (with key redacted), a failed read
// or another status is an error prefixed with api, the API's name.
func do(hc *http.Client, req *http.Request, key, api string) ([]byte, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", api, redactKey(err, key))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxAnswer))
	if err != nil {
		return nil, fmt.Errorf("%s: reading answer: %w", api, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d", api, resp.StatusCode)
	}
	return body, nil
}

// redactKey removes the API key from an error (url.Error quotes the URL).
func redactKey(err error, key string) error {
	if key == "" || !strings.Contains(err.Error(), key) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), key, "REDACTED"))
}
