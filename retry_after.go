package pingback

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// retryAfter reads the app's Retry-After header from an answer with
// status, as RFC 9110 section 10.2.3 defines it: either delta-seconds (a
// non-negative decimal integer) or an HTTP-date. It is honoured on 429 Too
// Many Requests and 503 Service Unavailable only (the statuses for which
// RFC 9110 and RFC 6585 give it the meaning "try again after"); on any
// other status, and for 0, a date at or before now, or a value that does
// not parse, it returns 0: no wait asked for.
//
// The wait is from now, the time the answer was read; an HTTP-date is
// compared with now, so it is only as good as the two clocks agree.
func retryAfter(status int, h http.Header, now time.Time) time.Duration {
	if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
		return 0
	}
	return parseRetryAfter(h.Get("Retry-After"), now)
}

// maxRetryAfterSeconds bounds the wait parseRetryAfter returns (68 years:
// a delta-seconds value stays far from overflowing a time.Duration; the
// caller caps the wait by backoff's maximum anyway).
const maxRetryAfterSeconds = 1 << 31

// parseRetryAfter parses a Retry-After value (delta-seconds or an
// HTTP-date in any of the three formats http.ParseTime accepts) into the
// wait it asks for from now; 0 for a value that asks for none or does not
// parse.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0
		}
		return time.Duration(min(n, maxRetryAfterSeconds)) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil || !t.After(now) {
		return 0
	}
	return min(t.Sub(now), maxRetryAfterSeconds*time.Second)
}
