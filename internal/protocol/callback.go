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

// ParseJSONCallback reads a JSON callback. The anti-captcha family POSTs the
// getTaskResult answer (errorId, status, solution, cost, ip, createTime,
// endTime, solveCount) with the task id as taskId
// (https://docs.capmonster.cloud/docs/api/methods/create-task). The
// 2captcha API v2 and CapSolver document no format
// (https://2captcha.com/api-docs/create-task,
// https://docs.capsolver.com/guide/api-createtask), so every plausible
// shape is taken: the id as taskId, id or task_id (a number or a string);
// the result as solution (any JSON value but null), as code (a string), or,
// with errorId above 0, as errorCode. The callback is sent when the task
// ends, so any errorCode it carries is the task's outcome.
func (p Provider) ParseJSONCallback(body []byte) (Callback, error) {
	var v map[string]json.RawMessage
	if !isObject(body) || json.Unmarshal(body, &v) != nil {
		return Callback{}, CallbackError("malformed JSON body: want an object")
	}
	cb := Callback{Answer: body}
	var found bool
	for _, k := range []string{"taskId", "id", "task_id"} {
		if raw, ok := v[k]; ok {
			if cb.ID, found = jsonID(raw); found {
				break
			}
			return cb, CallbackError("malformed " + k)
		}
	}
	if !found {
		return cb, CallbackError("missing taskId")
	}
	if !p.ValidID(cb.ID) {
		return cb, CallbackError("malformed taskId: want " + p.IDRule())
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
	return cb, CallbackError("no result: want solution, code or errorId with errorCode")
}

// IsCallbackError reports whether err is a CallbackError.
func IsCallbackError(err error) bool {
	var ce CallbackError
	return errors.As(err, &ce)
}
