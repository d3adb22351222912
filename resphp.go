package pingback

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// resClient asks a provider's res.php for results.
type resClient struct {
	endpoint string // base URL, without /res.php
	key      string
	method   string // http.MethodPost: parameters in a form body; else GET
	http     *http.Client
}

// get asks res.php action=get, json=1 (a POST form or a GET query, as
// c.method says) for one id ("id") or several ("ids",
// comma-joined) and returns the classified answers (protocol.ParseResAnswer):
// one element per asked id for a well-formed answer. A transport error, a
// non-200 status or a body that is not the protocol's JSON is an error,
// which the poller takes as a reason to back off.
func (c *resClient) get(ctx context.Context, ids []string) ([]protocol.Answer, error) {
	q := url.Values{"key": {c.key}, "action": {"get"}, "json": {"1"}}
	if len(ids) == 1 {
		q.Set("id", ids[0])
	} else {
		q.Set("ids", strings.Join(ids, ","))
	}
	var req *http.Request
	var err error
	if c.method == http.MethodPost {
		// The key in the body: in no URL, so in no access log.
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint+"/res.php", strings.NewReader(q.Encode()))
		if req != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
	} else {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, c.endpoint+"/res.php?"+q.Encode(), nil)
	}
	if err != nil {
		return nil, err
	}
	body, err := doAPI(c.http, req, c.key, "res.php")
	if err != nil {
		return nil, err
	}
	return protocol.ParseResAnswer(body, len(ids))
}

// doAPI sends a request to a provider's API and returns the body of a 200
// answer (at most 1 MiB), with the API key redacted from errors.
func doAPI(hc *http.Client, req *http.Request, key, what string) ([]byte, error) {
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, redactKey(err, key))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: reading answer: %w", what, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d", what, resp.StatusCode)
	}
	return body, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// redactKey removes the API key from an error (url.Error quotes the URL).
func redactKey(err error, key string) error {
	if key == "" || !strings.Contains(err.Error(), key) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), key, "REDACTED"))
}
