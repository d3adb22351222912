package pingback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// answerKind classifies one res.php answer (or one element of a bulk one)
// as provider-protocol.md §1.6 and §5 describe.
type answerKind int

const (
	// answerResult: the task is solved; the text is the result.
	answerResult answerKind = iota
	// answerNotReady: CAPCHA_NOT_READY; ask again next interval.
	answerNotReady
	// answerTaskError: a task-final error (ERROR_CAPTCHA_UNSOLVABLE and the
	// like), delivered to the app as code=<error> like the provider's own
	// pingback would be.
	answerTaskError
	// answerUnknownTask: the provider does not know the id (any more):
	// ERROR_WRONG_CAPTCHA_ID, ERROR_WRONG_ID_FORMAT. The task expires.
	answerUnknownTask
	// answerBackoff: an account, rate or server condition; back off the
	// whole provider and leave the tasks pending.
	answerBackoff
	// answerKeyError: the API key is wrong; stop polling the provider.
	answerKeyError
)

// answer is one classified res.php answer.
type answer struct {
	kind answerKind
	text string        // the result or the error code
	wait time.Duration // for answerBackoff: the provider's documented block, if any
}

// taskErrors end a task with an error the app should see as its result.
// Source: provider-protocol.md §1.6 (res.php errors).
var taskErrors = map[string]bool{
	"ERROR_CAPTCHA_UNSOLVABLE":      true,
	"ERROR_BAD_DUPLICATES":          true,
	"ERROR_TOKEN_EXPIRED":           true,
	"ERROR_PROXY_CONNECTION_FAILED": true,
}

// backoffErrors are account and rate conditions with the block each one
// documents (provider-protocol.md §1.6 "Request limits" and in.php errors;
// CaptchaAI's ERROR_ZERO_BALANCE means "no free threads", a transient state).
var backoffErrors = map[string]time.Duration{
	"ERROR_NO_SLOT_AVAILABLE":     5 * time.Second,
	"MAX_USER_TURN":               10 * time.Second,
	"ERROR_ZERO_BALANCE":          60 * time.Second,
	"IP_BANNED":                   5 * time.Minute,
	"ERROR_IP_BLOCKED":            5 * time.Minute,
	"ERROR: 1001":                 10 * time.Minute,
	"ERROR: 1002":                 5 * time.Minute,
	"ERROR: 1003":                 30 * time.Second,
	"ERROR: 1004":                 10 * time.Minute,
	"ERROR: 1005":                 5 * time.Minute,
	"ERROR_SERVER_ERROR":          10 * time.Second,
	"ERROR_INTERNAL_SERVER_ERROR": 10 * time.Second,
}

// keyErrors mean the configured API key is unusable.
var keyErrors = map[string]bool{
	"ERROR_WRONG_USER_KEY":     true,
	"ERROR_KEY_DOES_NOT_EXIST": true,
}

// classifyText classifies one answer text (plain form, after "OK|" is
// stripped by the caller for results).
func classifyText(s string) answer {
	switch {
	case s == "CAPCHA_NOT_READY" || s == "CAPTCHA_NOT_READY":
		return answer{kind: answerNotReady, text: s}
	case taskErrors[s]:
		return answer{kind: answerTaskError, text: s}
	case s == "ERROR_WRONG_CAPTCHA_ID" || s == "ERROR_WRONG_ID_FORMAT" || s == "ERROR_NO_SUCH_CAPCHA_ID":
		return answer{kind: answerUnknownTask, text: s}
	case keyErrors[s]:
		return answer{kind: answerKeyError, text: s}
	}
	if d, ok := backoffErrors[s]; ok {
		return answer{kind: answerBackoff, text: s, wait: d}
	}
	if strings.HasPrefix(s, "ERROR: ") {
		return answer{kind: answerBackoff, text: s, wait: 5 * time.Minute}
	}
	if strings.HasPrefix(s, "ERROR") || s == "" {
		// An error we do not know: not a result. Back off rather than
		// deliver or drop something we do not understand.
		return answer{kind: answerBackoff, text: s}
	}
	return answer{kind: answerResult, text: s}
}

// resClient asks a provider's res.php for results.
type resClient struct {
	endpoint string // base URL, without /res.php
	key      string
	http     *http.Client
}

// resAnswer is res.php's JSON answer (json=1): {"status":1,"request":...}.
// request is a string, but may be an object (Amazon WAF) or a number.
type resAnswer struct {
	Status  int             `json:"status"`
	Request json.RawMessage `json:"request"`
}

// get asks res.php?action=get&json=1 for one id ("id") or several ("ids",
// comma-joined) and returns the raw answers: one element per asked id for a
// well-formed answer. A transport error, a non-200 status or a body that is
// not the protocol's JSON is returned as a single answerBackoff.
func (c *resClient) get(ctx context.Context, ids []string) ([]answer, error) {
	q := url.Values{"key": {c.key}, "action": {"get"}, "json": {"1"}}
	if len(ids) == 1 {
		q.Set("id", ids[0])
	} else {
		q.Set("ids", strings.Join(ids, ","))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.endpoint+"/res.php?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("res.php: %w", redactKey(err, c.key))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("res.php: reading answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("res.php: HTTP %d", resp.StatusCode)
	}
	return parseResAnswer(body, len(ids))
}

// parseResAnswer parses a json=1 res.php answer for n ids. Single: status 1
// means a result; status 0 carries CAPCHA_NOT_READY or an error. Bulk: the
// request is the elements joined with "|" in the order of ids
// (provider-protocol.md §1.4; the shape comes from third-party clients).
// A status-0 bulk answer is one code for the whole request.
func parseResAnswer(body []byte, n int) ([]answer, error) {
	var ra resAnswer
	if err := json.Unmarshal(body, &ra); err != nil || ra.Request == nil || string(ra.Request) == "null" {
		// The body is not quoted: it may hold a result.
		return nil, fmt.Errorf("res.php: not a protocol answer (%d bytes)", len(body))
	}
	text := requestText(ra.Request)
	if ra.Status != 1 {
		a := classifyText(text)
		if a.kind == answerResult {
			a.kind = answerBackoff // status 0 is never a result
		}
		return []answer{a}, nil
	}
	if n == 1 && text != "" { // an empty one is classified below: never a result
		return []answer{{kind: answerResult, text: text}}, nil
	}
	parts := strings.Split(text, "|")
	out := make([]answer, len(parts))
	for i, p := range parts {
		out[i] = classifyText(p)
	}
	return out, nil
}

// requestText turns the JSON "request" field into the code string: a JSON
// string as is, anything else (a number, an object) as its JSON text.
func requestText(raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	return string(raw)
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
