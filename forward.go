package pingback

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// outcomeClass is what a forward's result means for the record.
type outcomeClass int

const (
	// delivered: the app answered 2xx or 3xx (or nothing answered, which
	// Caddy sends as an empty 200).
	delivered outcomeClass = iota
	// retryable: a transport error, 5xx, 408 or 429; the replay loop
	// retries it.
	retryable
	// rejected: any other 4xx; kept, not retried automatically.
	rejected
	// timedOut: the app did not answer within forward_timeout; a failure
	// like retryable.
	timedOut
	// interrupted: the forward was cut before it ended (the config
	// stopped, or the lease was lost); not a failure, replayed at once.
	interrupted
)

// String is the class as the forwards_total metric's outcome label.
func (c outcomeClass) String() string {
	switch c {
	case delivered:
		return "delivered"
	case retryable:
		return "failed"
	case timedOut:
		return "timeout"
	case interrupted:
		return "interrupted"
	default:
		return "rejected"
	}
}

// failed reports whether the class is an attempt that failed and counts
// toward max_attempts.
func (c outcomeClass) failed() bool { return c == retryable || c == timedOut }

// outcome is the result of one forward to the app.
type outcome struct {
	class  outcomeClass
	status int   // the app's status, or the handler error's status; 0 if the app gave none
	err    error // the handler chain's error, if any
}

// Why a forward's context ended early (context.Cause).
var (
	errForwardTimeout = errors.New("app did not answer within forward_timeout")
	errCut            = errors.New("interrupted: Caddy stopped or reloaded its config while the forward ran")
	errLeaseLost      = errors.New("interrupted: the lease of this forward could not be renewed")
)

// cutShort turns the outcome of a forward whose context ended early (cause
// is context.Cause of it) into a timeout or an interruption, with no app
// status. A delivery stands: the app took the result.
func cutShort(out outcome, cause error) outcome {
	if out.class == delivered || cause == nil {
		return out
	}
	switch {
	case errors.Is(cause, errForwardTimeout):
		return outcome{class: timedOut, err: cause}
	case errors.Is(cause, errCut), errors.Is(cause, errLeaseLost):
		return outcome{class: interrupted, err: cause}
	}
	return out
}

// forward runs next on r with a response writer that keeps the app's answer
// away from the provider, and classifies what happened.
//
// A panic in the handler chain (reverse_proxy aborts with
// http.ErrAbortHandler when the app's body breaks off after its headers,
// for example when forward_timeout cuts it) is recovered here: it must not
// crash Caddy from a replay goroutine. A 2xx or 3xx already written counts
// as delivered; anything else as a retryable failure.
func forward(r *http.Request, next caddyhttp.Handler) (out outcome) {
	rec := caddyhttp.NewResponseRecorder(discardWriter{h: make(http.Header)}, nil, nil)
	defer func() {
		if v := recover(); v != nil {
			out = recovered(v, rec.Status())
		}
	}()
	err := next.ServeHTTP(rec, r)
	return classify(rec.Status(), err)
}

// recovered is the outcome of a forward whose handler chain panicked with
// v after writing status (0 if none).
func recovered(v any, status int) outcome {
	if status >= 200 && status < 400 {
		return outcome{class: delivered, status: status}
	}
	return outcome{class: retryable, err: fmt.Errorf("handler aborted the forward: %v", v)}
}

// classify maps the next handler's status and error to an outcome. A handler
// error carries its status (reverse_proxy: 502 for a refused connection, 504
// for a timeout, 499 if the request context ended); an error without a
// status counts as 502.
func classify(status int, err error) outcome {
	if err != nil {
		status = http.StatusBadGateway
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode != 0 {
			status = he.StatusCode
		}
		out := outcome{class: classOf(status), status: status, err: err}
		if out.class == delivered {
			// An error is never a delivery, whatever status it claims.
			out.class = retryable
		}
		return out
	}
	if status == 0 {
		status = http.StatusOK
	}
	return outcome{class: classOf(status), status: status}
}

func classOf(status int) outcomeClass {
	switch {
	case status < 400:
		return delivered
	case status >= 500, status == http.StatusRequestTimeout, status == http.StatusTooManyRequests,
		status == 499: // client (here: our own deadline) closed the request
		return retryable
	default:
		return rejected
	}
}

// errorText summarises an outcome for the record's last_error.
func (o outcome) errorText() string {
	switch {
	case o.class == timedOut:
		return errForwardTimeout.Error()
	case o.err != nil:
		return o.err.Error()
	case o.class != delivered:
		return fmt.Sprintf("app answered %d", o.status)
	}
	return ""
}

// discardWriter is the innermost response writer of a forward: the app's
// answer is recorded (status) and dropped.
type discardWriter struct{ h http.Header }

func (d discardWriter) Header() http.Header         { return d.h }
func (d discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d discardWriter) WriteHeader(int)             {}
