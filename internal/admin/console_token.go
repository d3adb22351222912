package admin

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ConsoleTokenHeader is the request header that carries the console page's
// action token.
const ConsoleTokenHeader = "X-Pingback-Console-Token"

// ConsoleTokenLife is how long a page's token is accepted after the page
// was served; a page left open longer asks to be reloaded.
const ConsoleTokenLife = 12 * time.Hour

// consoleSecret keys the tokens: random per process, so a token is valid
// across config reloads (each has its own Console) but not after a
// restart. It is allowed at package level because it is immutable: drawn
// once, never replaced (tests vary a token's time through the Console's
// clock, never the key).
var consoleSecret = sync.OnceValue(func() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather than return an error)
	return b
})

// NewToken returns a fresh token: a random nonce, the issue time (the
// console's clock) in Unix seconds and an HMAC-SHA256 of both under the
// process's secret, base64url, joined by dots. Every Console of the
// process accepts it until ConsoleTokenLife has passed.
func (c *Console) NewToken() string {
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	n := base64.RawURLEncoding.EncodeToString(nonce)
	ts := strconv.FormatInt(c.now().Unix(), 10)
	return n + "." + ts + "." + consoleMAC(n, ts)
}

func consoleMAC(nonce, ts string) string {
	m := hmac.New(sha256.New, consoleSecret())
	m.Write([]byte(nonce + "." + ts))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkToken reports why tok is not a valid, unexpired token.
func (c *Console) checkToken(tok string) error {
	if tok == "" {
		return errors.New("missing " + ConsoleTokenHeader + " header: reload the console page")
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 || !hmac.Equal([]byte(parts[2]), []byte(consoleMAC(parts[0], parts[1]))) {
		return errors.New("invalid console token: reload the console page")
	}
	issued, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return errors.New("invalid console token: reload the console page")
	}
	if age := c.now().Sub(time.Unix(issued, 0)); age > ConsoleTokenLife || age < -time.Minute {
		return errors.New("console token expired: reload the console page")
	}
	return nil
}

// checkRequest reports why an API request must be refused as possibly
// cross-site: no valid token; a no-cors or null-origin request; an Origin
// whose host is not the request's Host; or a state-changing request with
// neither Origin nor Sec-Fetch-Site: same-origin.
func (c *Console) checkRequest(r *http.Request) error {
	if err := c.checkToken(r.Header.Get(ConsoleTokenHeader)); err != nil {
		return err
	}
	if strings.Contains(r.Header.Get("Sec-Fetch-Mode"), "no-cors") {
		return errors.New("cross-site request refused: no-cors mode")
	}
	origin, hasOrigin := r.Header["Origin"]
	if hasOrigin {
		u, err := url.Parse(origin[0])
		if len(origin) != 1 || err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return errors.New("cross-site request refused: Origin " + strconv.Quote(strings.Join(origin, ", ")) + " is not this console's")
		}
		return nil
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return nil
	}
	if r.Header.Get("Sec-Fetch-Site") != "same-origin" {
		return errors.New("cross-site request refused: no Origin header and not Sec-Fetch-Site: same-origin")
	}
	return nil
}
