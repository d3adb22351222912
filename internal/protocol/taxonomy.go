package protocol

import (
	"strings"
	"time"
)

// Kind classifies one answer of a result request (res.php?action=get, or
// getTaskResult), or one element of a bulk res.php answer.
type Kind int

const (
	// Result: the task is solved; Code is the result.
	Result Kind = iota
	// NotReady: CAPCHA_NOT_READY or status "processing": ask again later.
	NotReady
	// TaskError: a task-final error (ERROR_CAPTCHA_UNSOLVABLE and the
	// like), delivered to the app as the task's result, as the provider's
	// own callback would.
	TaskError
	// UnknownTask: the provider does not know the task id (any more); the
	// task can only expire.
	UnknownTask
	// Backoff: an account, rate or server condition: back off the whole
	// provider for at least Wait and leave the tasks pending.
	Backoff
	// KeyError: the API key is wrong: stop polling the provider until the
	// key changes.
	KeyError
)

func (k Kind) String() string {
	switch k {
	case Result:
		return "result"
	case NotReady:
		return "not_ready"
	case TaskError:
		return "task_error"
	case UnknownTask:
		return "unknown_task"
	case Backoff:
		return "backoff"
	case KeyError:
		return "key_error"
	}
	return "unknown"
}

// Answer is one classified answer for one task.
type Answer struct {
	Kind Kind
	// Code is the result (a legacy answer's text; the canonical JSON of a
	// JSON answer's solution) or the error code.
	Code string
	// Wait is the provider's documented block for Backoff answers; zero
	// when none is documented.
	Wait time.Duration
	// Raw is the provider's whole answer for this one task, byte for byte
	// (nil for the elements of a bulk answer, and for plain-text answers
	// of the legacy family, whose whole answer is OK|Code).
	Raw []byte
}

// Final reports whether the answer ends the task with something the app
// must get: a result or a task-final error.
func (a Answer) Final() bool { return a.Kind == Result || a.Kind == TaskError }

// taskErrors end a task with an error the app should see as its result:
// res.php's task errors (https://2captcha.com/2captcha-api#res_errors) and
// the JSON APIs' task-level errors
// (https://anti-captcha.com/apidoc/errors, https://2captcha.com/api-docs/error-codes).
var taskErrors = map[string]bool{
	"ERROR_CAPTCHA_UNSOLVABLE":        true,
	"ERROR_BAD_DUPLICATES":            true,
	"ERROR_TOKEN_EXPIRED":             true,
	"ERROR_PROXY_CONNECTION_FAILED":   true,
	"ERROR_PROXY_CONNECT_REFUSED":     true,
	"ERROR_PROXY_CONNECT_TIMEOUT":     true,
	"ERROR_PROXY_READ_TIMEOUT":        true,
	"ERROR_PROXY_BANNED":              true,
	"ERROR_PROXY_TRANSPARENT":         true,
	"ERROR_RECAPTCHA_TIMEOUT":         true,
	"ERROR_RECAPTCHA_INVALID_SITEKEY": true,
	"ERROR_RECAPTCHA_INVALID_DOMAIN":  true,
	"ERROR_FAILED_LOADING_WIDGET":     true,
	"ERROR_VISIBLE_RECAPTCHA":         true,
	"ERROR_ALL_WORKERS_FILTERED":      true,
	"ERROR_MAXIMUM_TIME_EXCEED":       true,
}

// IsTaskError reports whether code is a task-final error code.
func IsTaskError(code string) bool { return taskErrors[code] }

// unknownTask: the provider does not know the id. res.php:
// ERROR_WRONG_CAPTCHA_ID, ERROR_WRONG_ID_FORMAT
// (https://2captcha.com/2captcha-api#res_errors); JSON:
// ERROR_NO_SUCH_CAPCHA_ID, spelt ERROR_NO_SUCH_CAPTCHA_ID too
// (https://anti-captcha.com/apidoc/errors,
// https://zennolab.atlassian.net/wiki/spaces/APIS/pages/295396/Error+Types).
var unknownTask = map[string]bool{
	"ERROR_WRONG_CAPTCHA_ID":   true,
	"ERROR_WRONG_ID_FORMAT":    true,
	"ERROR_NO_SUCH_CAPCHA_ID":  true,
	"ERROR_NO_SUCH_CAPTCHA_ID": true,
}

// backoffErrors are account and rate conditions, with the block each one
// documents: res.php's "Request limits" and in.php errors
// (https://2captcha.com/2captcha-api#limits); CaptchaAI's
// ERROR_ZERO_BALANCE means "no free threads", a transient state
// (https://docs.captchaai.com/pages/err_handling); CapMonster bans for 10
// minutes (https://docs.capmonster.cloud/docs/api/block-reason/).
var backoffErrors = map[string]time.Duration{
	"ERROR_NO_SLOT_AVAILABLE":     5 * time.Second,
	"MAX_USER_TURN":               10 * time.Second,
	"ERROR_ZERO_BALANCE":          60 * time.Second,
	"IP_BANNED":                   5 * time.Minute,
	"ERROR_IP_BLOCKED":            5 * time.Minute,
	"ERROR_IP_NOT_ALLOWED":        5 * time.Minute,
	"ERROR_TOO_MUCH_REQUESTS":     10 * time.Minute,
	"ERROR: 1001":                 10 * time.Minute,
	"ERROR: 1002":                 5 * time.Minute,
	"ERROR: 1003":                 30 * time.Second,
	"ERROR: 1004":                 10 * time.Minute,
	"ERROR: 1005":                 5 * time.Minute,
	"ERROR_SERVER_ERROR":          10 * time.Second,
	"ERROR_INTERNAL_SERVER_ERROR": 10 * time.Second,
}

// keyErrors mean the API key is unusable
// (https://2captcha.com/2captcha-api#res_errors, https://anti-captcha.com/apidoc/errors).
var keyErrors = map[string]bool{
	"ERROR_WRONG_USER_KEY":     true,
	"ERROR_KEY_DOES_NOT_EXIST": true,
}

// classifyCode classifies an error or status code that is not a result.
// An unknown ERROR code backs off: never deliver or drop what is not
// understood.
func classifyCode(s string) Answer {
	switch {
	case s == "CAPCHA_NOT_READY" || s == "CAPTCHA_NOT_READY":
		return Answer{Kind: NotReady, Code: s}
	case taskErrors[s]:
		return Answer{Kind: TaskError, Code: s}
	case unknownTask[s]:
		return Answer{Kind: UnknownTask, Code: s}
	case keyErrors[s]:
		return Answer{Kind: KeyError, Code: s}
	}
	if d, ok := backoffErrors[s]; ok {
		return Answer{Kind: Backoff, Code: s, Wait: d}
	}
	if strings.HasPrefix(s, "ERROR: ") {
		return Answer{Kind: Backoff, Code: s, Wait: 5 * time.Minute}
	}
	return Answer{Kind: Backoff, Code: s}
}

// ClassifyLegacy classifies one res.php answer text (plain form, after
// "OK|" is stripped by the caller for results): CAPCHA_NOT_READY, an
// ERROR code, or else a result. CAPTCHA_NOT_READY is read too, as some
// clients do.
func ClassifyLegacy(s string) Answer {
	if s == "" || strings.HasPrefix(s, "ERROR") || s == "CAPCHA_NOT_READY" || s == "CAPTCHA_NOT_READY" ||
		s == "MAX_USER_TURN" || s == "IP_BANNED" {
		return classifyCode(s)
	}
	return Answer{Kind: Result, Code: s}
}

// ClassifyJSONError classifies the errorCode of a JSON answer whose
// errorId is above 0.
func ClassifyJSONError(code string) Answer { return classifyCode(code) }
