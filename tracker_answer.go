package pingback

import (
	"bytes"
	"errors"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
)

// DefaultMaxAnswer is the largest provider answer pingback_track buffers
// to read a task id or a result from: 1 MiB. A provider answer (OK|<id>,
// a JSON status, a token of a few kB) is far below it.
const DefaultMaxAnswer = 1 << 20

// answerRecorder buffers the upstream's answer up to limit bytes, so that
// pingback_track can read it before the app gets it. An answer that grows
// past limit is streamed through instead: what was buffered is written
// out with the status and the rest passes straight on, so memory stays
// bounded whatever the upstream sends. The header map is the real
// writer's (the upstream's headers, Content-Length included, are the
// app's).
type answerRecorder struct {
	w         http.ResponseWriter
	limit     int64
	buf       bytes.Buffer
	status    int
	streaming bool
	onStream  func() // called once, when the answer outgrows limit
}

func (a *answerRecorder) Header() http.Header { return a.w.Header() }

func (a *answerRecorder) WriteHeader(status int) {
	if status < 200 {
		a.w.WriteHeader(status) // 1xx (103 Early Hints) pass on at once
		return
	}
	if a.status == 0 {
		a.status = status
	}
}

func (a *answerRecorder) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	if a.streaming {
		return a.w.Write(p)
	}
	if int64(a.buf.Len())+int64(len(p)) <= a.limit {
		return a.buf.Write(p)
	}
	if err := a.stream(); err != nil {
		return 0, err
	}
	return a.w.Write(p)
}

// stream switches to passing the answer through.
func (a *answerRecorder) stream() error {
	a.streaming = true
	if a.onStream != nil {
		a.onStream()
	}
	a.w.WriteHeader(a.status)
	_, err := a.w.Write(a.buf.Bytes())
	a.buf = bytes.Buffer{}
	return err
}

// Flush passes a flush on once streaming; a buffered answer is written
// whole by writeResponse.
func (a *answerRecorder) Flush() {
	if a.streaming {
		_ = http.NewResponseController(a.w).Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (a *answerRecorder) Unwrap() http.ResponseWriter { return a.w }

// Status is the upstream's status (200 if it wrote a body without one).
func (a *answerRecorder) Status() int { return a.status }

// WriteResponse writes the buffered answer to the app, unchanged.
func (a *answerRecorder) WriteResponse() error {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	a.w.WriteHeader(a.status)
	_, err := a.w.Write(a.buf.Bytes())
	return err
}

// bufferUpstream passes r to next with the answer buffered up to
// max_answer, and returns the recorder and the answer's body, decoded
// (Content-Encoding undone, at most max_answer bytes). A nil recorder
// means the answer was not buffered (larger than max_answer: streamed to
// the app untracked, with a warn line) and is already written.
func (t *Tracker) bufferUpstream(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) (*answerRecorder, []byte, error) {
	rec := &answerRecorder{w: w, limit: t.MaxAnswer}
	rec.onStream = func() {
		t.logger.Warn("provider answer larger than max_answer: streamed to the app untracked (no task recorded, no result stored)",
			zap.String("provider", t.Provider), zap.String("path", r.URL.Path), zap.Int64("max_answer", t.MaxAnswer))
	}
	if err := next.ServeHTTP(rec, r); err != nil {
		return nil, nil, err
	}
	if rec.streaming {
		return nil, nil, nil
	}
	return rec, decodedBody(rec.Header(), rec.buf.Bytes(), t.MaxAnswer), nil
}

// upstreamGuard wraps the handler chain after pingback_track (the
// reverse_proxy to the provider) so that a failure to reach the provider
// is answered here, with a log line that names no secret, instead of
// being returned to Caddy's server, whose error log records the request
// URI: for a GET submission, /in.php?key=<the account's API key>. The app
// gets the status reverse_proxy chose (502 for a refused connection, 504
// for a timeout) and a short plain-text reason. An error after part of
// the answer was written is only logged: the app sees the connection cut.
func (t *Tracker) upstreamGuard(next caddyhttp.Handler) caddyhttp.Handler {
	return caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		rec := caddyhttp.NewResponseRecorder(w, nil, nil)
		err := next.ServeHTTP(rec, r)
		if err == nil {
			return nil
		}
		status := http.StatusBadGateway
		var he caddyhttp.HandlerError
		if errors.As(err, &he) && he.StatusCode >= 400 {
			status = he.StatusCode
		}
		t.logger.Warn("provider request failed; answered the app itself",
			zap.String("provider", t.Provider), zap.String("method", r.Method), zap.String("path", r.URL.Path),
			zap.Int("status", status), zap.String("error", t.redactSecrets(r, err.Error())))
		if rec.Status() != 0 {
			return nil // the answer had begun: nothing more to write
		}
		return writeText(w, status, "provider request failed: "+http.StatusText(status))
	})
}

// redactSecrets removes from msg the configured API keys and the key or
// clientKey the request itself carries (in its query; a body's secrets
// are not in Caddy's errors).
func (t *Tracker) redactSecrets(r *http.Request, msg string) string {
	secrets := t.app.providerConfig(t.Provider).keys()
	q := parseURLEncoded(r.URL.RawQuery)
	secrets = append(secrets, q["key"]...)
	secrets = append(secrets, q["clientKey"]...)
	for _, s := range secrets {
		if len(s) >= 4 {
			msg = strings.ReplaceAll(msg, s, "REDACTED")
		}
	}
	return msg
}
