package protocol

import (
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
)

// Callback is a parsed pingback: the task id and its result.
type Callback struct {
	ID string
	// Code is the result: the form's code; for a JSON callback the
	// canonical JSON of solution, or the errorCode of an errorId > 0 one.
	Code string
	// Answer is a JSON callback's body (the provider's whole answer);
	// nil for a form callback.
	Answer []byte
}

// CallbackError is a callback that cannot be taken: a short reason for a
// 400 answer.
type CallbackError string

func (e CallbackError) Error() string { return string(e) }

// ParseFormCallback reads a legacy pingback from its fields (the query of a GET,
// the form body of a POST merged over the query): id and code, each
// exactly once and non-empty (https://2captcha.com/2captcha-api#pingback;
// CaptchaAI: YOUR_URL?id=TASK_ID&code=TOKEN, per its blog
// https://blog.captchaai.com/captchaai-pingback-task-notification-patterns).
// code may be an error code such as ERROR_CAPTCHA_UNSOLVABLE: a result
// like any other.
func (p Provider) ParseFormCallback(fields url.Values) (Callback, error) {
	var cb Callback
	var err error
	if cb.ID, err = field(fields, "id"); err != nil {
		return cb, err
	}
	if cb.Code, err = field(fields, "code"); err != nil {
		return cb, err
	}
	if !p.ValidID(cb.ID) {
		return cb, CallbackError("malformed id: want " + p.IDRule())
	}
	return cb, nil
}

func field(form url.Values, name string) (string, error) {
	vals := form[name]
	switch {
	case len(vals) == 0 || vals[0] == "":
		return "", CallbackError("missing " + name)
	case len(vals) > 1:
		return "", CallbackError("more than one " + name)
	}
	return vals[0], nil
}

// NotResultError is a JSON callback that names a task (ID, valid for the
// provider) but carries no result for it: errorId above 0 with an error
// that does not end the task (ClassifyJSONError: an account, key, rate or
// server condition, an unknown task, or a code the taxonomy does not
// know). It is not a CallbackError: the provider is answered 200 (it did
// nothing wrong, and a 4xx would only make it retry or flag the URL), the
// callback is logged and counted but neither stored nor forwarded, so a
// tracked task stays pending and the poller still fetches its real
// outcome. Answer is the classification (Kind and Code).
type NotResultError struct {
	ID     string
	Answer Answer
}

func (e *NotResultError) Error() string {
	return "callback for task " + e.ID + " carries no result: " + e.Answer.Kind.String() + " " + e.Answer.Code
}

// ParseJSONCallback reads a JSON callback. The anti-captcha family POSTs the
// getTaskResult answer (errorId, status, solution, cost, ip, createTime,
// endTime, solveCount) with the task id as taskId
// (https://docs.capmonster.cloud/docs/api/methods/create-task). The
// 2captcha API v2 and CapSolver document no format
// (https://2captcha.com/api-docs/create-task,
// https://docs.capsolver.com/guide/api-createtask), so every plausible
// shape is taken: the id as taskId, id or task_id (a number or a string;
// the first of them that holds a valid id for the provider wins, so a null
// or malformed taskId beside a valid id is no error); the result as
// solution (any JSON value but null), as code (a string), or, with errorId
// above 0 and a task-final errorCode (ClassifyJSONError: TaskError, such as
// ERROR_CAPTCHA_UNSOLVABLE), as that errorCode. Any other errorId above 0
// is a *NotResultError.
func (p Provider) ParseJSONCallback(body []byte) (Callback, error) {
	var v map[string]json.RawMessage
	if !isObject(body) || json.Unmarshal(body, &v) != nil {
		return Callback{}, CallbackError("malformed JSON body: want an object")
	}
	cb := Callback{Answer: body}
	var bad string // the first id key present whose value is no valid id
	for _, k := range []string{"taskId", "id", "task_id"} {
		raw, ok := v[k]
		if !ok {
			continue
		}
		if id, ok := jsonID(raw); ok && p.ValidID(id) {
			cb.ID = id
			break
		}
		if bad == "" {
			bad = k
		}
	}
	switch {
	case cb.ID == "" && bad != "":
		return cb, CallbackError("malformed " + bad + ": want " + p.IDRule())
	case cb.ID == "":
		return cb, CallbackError("missing taskId")
	}
	n, ok := errorID(v["errorId"])
	if !ok {
		return cb, CallbackError("malformed errorId")
	}
	if n > 0 {
		var code string
		if json.Unmarshal(v["errorCode"], &code) != nil || code == "" {
			code = "ERROR_ID_" + strconv.FormatInt(n, 10)
		}
		if a := ClassifyJSONError(code); a.Kind != TaskError {
			return cb, &NotResultError{ID: cb.ID, Answer: a}
		}
		cb.Code = code
		return cb, nil
	}
	if sol, ok := v["solution"]; ok && string(sol) != "null" {
		code, err := CanonicalJSON(sol)
		if err != nil {
			return cb, CallbackError("malformed solution")
		}
		cb.Code = code
		return cb, nil
	}
	if raw, ok := v["code"]; ok {
		var s string
		if json.Unmarshal(raw, &s) == nil && s != "" {
			cb.Code = s
			return cb, nil
		}
	}
	return cb, CallbackError("no result: want solution, code or errorId with a task-final errorCode")
}

// IsCallbackError reports whether err is a CallbackError.
func IsCallbackError(err error) bool {
	var ce CallbackError
	return errors.As(err, &ce)
}
