package pingback

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// notResult answers a JSON callback that names a task but carries no
// result for it (errorId above 0 with an account, key, rate, server or
// unknown-task error, or a code the protocol package does not know): 200,
// so the provider neither retries nor flags the URL, and nothing is stored
// or forwarded. A tracked task stays pending: the poller asks
// getTaskResult and delivers the real outcome (a result, a task-final
// error, or the task expires). The callback is logged at warn level with
// its task id and code, and counted as callbacks{result="not_result"}.
func (h *Handler) notResult(w http.ResponseWriter, nr *protocol.NotResultError) error {
	h.app.metrics.callbacks.WithLabelValues(h.Provider, "not_result").Inc()
	h.logger.Warn("callback carries an error that is not the task's outcome: answered 200, not stored or forwarded; a tracked task is still polled",
		zap.String("provider", h.Provider), zap.String("id", nr.ID),
		zap.String("kind", nr.Answer.Kind.String()), zap.String("code", nr.Answer.Code))
	return writeText(w, http.StatusOK, "OK")
}
