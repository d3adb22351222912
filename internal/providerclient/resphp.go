package providerclient

import (
	"context"
	"net/http"
	"net/url"
	"strings"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// ResPHP asks a provider's legacy res.php API for results
// (https://2captcha.com/2captcha-api). Its zero Method asks with GET. A ResPHP is safe for
// concurrent use if its HTTP client is.
type ResPHP struct {
	// Endpoint is the API's base URL, without /res.php and without a
	// trailing slash: https://2captcha.com, say. An Endpoint that is no
	// URL fails Get as http.NewRequest does.
	Endpoint string
	// Key is the account's API key, sent as the key parameter.
	Key string
	// Method is http.MethodPost to send the parameters in a form body
	// (the key then is in no URL, so in no access log); anything else
	// sends them in the query of a GET.
	Method string
	// HTTP sends the requests; its Timeout bounds a call along with the
	// context.
	HTTP *http.Client
}

// Get asks res.php action=get, json=1 for one id ("id") or several ("ids",
// comma-joined) and returns the classified answers
// (protocol.ParseResAnswer): one element per asked id for a well-formed
// answer, a single one when the provider answers for the whole request. A
// transport error (the key redacted), a failed read, a non-200 status
// ("res.php: HTTP 502") or a body that is not the protocol's JSON (wrapping
// protocol.ErrNotProtocol) is an error, each prefixed "res.php: ".
func (c *ResPHP) Get(ctx context.Context, ids []string) ([]protocol.Answer, error) {
	q := url.Values{"key": {c.Key}, "action": {"get"}, "json": {"1"}}
	if len(ids) == 1 {
		q.Set("id", ids[0])
	} else {
		q.Set("ids", strings.Join(ids, ","))
	}
	var req *http.Request
	var err error
	if c.Method == http.MethodPost {
		// The key in the body: in no URL, so in no access log.
		req, err = newRequest(ctx, http.MethodPost, c.Endpoint+"/res.php", []byte(q.Encode()), "application/x-www-form-urlencoded")
	} else {
		req, err = newRequest(ctx, http.MethodGet, c.Endpoint+"/res.php?"+q.Encode(), nil, "")
	}
	if err != nil {
		return nil, err
	}
	body, err := do(c.HTTP, req, c.Key, "res.php")
	if err != nil {
		return nil, err
	}
	return protocol.ParseResAnswer(body, len(ids))
}
