package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// The JSON createTask / getTaskResult API of anti-captcha, CapMonster
// Cloud, CapSolver and 2captcha's and rucaptcha's API v2
// (https://anti-captcha.com/apidoc/methods/createTask,
// https://anti-captcha.com/apidoc/methods/getTaskResult,
// https://docs.capmonster.cloud/docs/api/methods/create-task,
// https://docs.capsolver.com/guide/api-createtask,
// https://2captcha.com/api-docs/create-task,
// https://2captcha.com/api-docs/get-task-result).

// CanonicalJSON returns the canonical JSON text of a JSON value: no
// insignificant space, object members sorted by key (at every depth), no
// HTML escaping, numbers as written. It is the `code` of a JSON result, so
// that a callback and a poll of the same solution compare equal whatever
// their member order and spacing.
func CanonicalJSON(raw []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	if _, err := dec.Token(); err == nil {
		return "", errors.New("trailing data after the JSON value")
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return string(bytes.TrimRight(b.Bytes(), "\n")), nil
}

// CreateTask is what the plugin reads of a createTask request: POST JSON
// {"clientKey":"...","task":{"type":"...",...},"callbackUrl":"..."}.
type CreateTask struct {
	ClientKey string
	TaskType  string
	// CallbackURL is the request's callbackUrl; a missing, null or empty
	// one is "".
	CallbackURL string
}

// ParseCreateTask reads a createTask request body; ok is false for a body
// that is not a JSON object.
func ParseCreateTask(body []byte) (CreateTask, bool) {
	var v struct {
		ClientKey   any `json:"clientKey"`
		Task        any `json:"task"`
		CallbackURL any `json:"callbackUrl"`
	}
	if !isObject(body) || json.Unmarshal(body, &v) != nil {
		return CreateTask{}, false
	}
	ct := CreateTask{}
	ct.ClientKey, _ = v.ClientKey.(string)
	ct.CallbackURL, _ = v.CallbackURL.(string)
	if t, ok := v.Task.(map[string]any); ok {
		ct.TaskType, _ = t["type"].(string)
	}
	return ct, true
}

// AddCallbackURL returns body with "callbackUrl":"<u>" added as the last
// member of the top-level object, every other byte unchanged. A
// callbackUrl member that is null or "" counts as none: it is taken out
// (with its comma) and the new one added last, so the object never holds
// the member twice. ok is false for a body that is not a JSON object, one
// whose callbackUrl is set, or one that holds the member more than once.
func AddCallbackURL(body []byte, u string) ([]byte, bool) {
	if !isObject(body) {
		return nil, false
	}
	type span struct{ start, end int } // a member, from after the previous token to the end of its value
	var members []span
	var existing = -1
	dec := json.NewDecoder(bytes.NewReader(body))
	_, _ = dec.Token() // '{'
	prev := int(dec.InputOffset())
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		key, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		end := int(dec.InputOffset())
		if key == "callbackUrl" {
			if existing >= 0 {
				return nil, false
			}
			if s := string(v); s != "null" && s != `""` {
				return nil, false
			}
			existing = len(members)
		}
		members = append(members, span{prev, end})
		prev = end
	}
	out := bytes.Clone(body)
	if existing >= 0 {
		m := members[existing]
		start, end := m.start, m.end
		if existing == 0 {
			// The first member: take the comma after it instead of
			// the one before it (there is none).
			if len(members) > 1 {
				end = members[1].start + bytes.IndexByte(body[members[1].start:], ',') + 1
			}
		}
		out = append(out[:start:start], body[end:]...)
	}
	brace := bytes.LastIndexByte(out, '}')
	inner := trimJSONSpace(out[bytes.IndexByte(out, '{')+1 : brace])
	member := append([]byte(`"callbackUrl":`), quote(u)...)
	if len(inner) > 0 {
		member = append([]byte(","), member...)
	}
	res := make([]byte, 0, len(out)+len(member))
	res = append(res, out[:brace]...)
	res = append(res, member...)
	return append(res, out[brace:]...), true
}

// taskAnswer is the shape of createTask and getTaskResult answers.
type taskAnswer struct {
	ErrorID   json.RawMessage `json:"errorId"`
	ErrorCode string          `json:"errorCode"`
	TaskID    json.RawMessage `json:"taskId"`
	Status    string          `json:"status"`
	Solution  json.RawMessage `json:"solution"`
}

// errorID reads errorId: a JSON number (a string of digits too, leniently);
// absent is 0. ok is false for anything else.
func errorID(raw json.RawMessage) (int64, bool) {
	if raw == nil {
		return 0, true
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		i, err := strconv.ParseInt(n.String(), 10, 64)
		return i, err == nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		i, err := strconv.ParseInt(s, 10, 64)
		return i, err == nil
	}
	return 0, false
}

// solutionAnswer builds the Result answer of a ready task.
func solutionAnswer(ta taskAnswer, body []byte) (Answer, bool) {
	if len(ta.Solution) == 0 || string(ta.Solution) == "null" {
		return Answer{}, false
	}
	code, err := CanonicalJSON(ta.Solution)
	if err != nil {
		return Answer{}, false
	}
	return Answer{Kind: Result, Code: code, Raw: bytes.Clone(trimJSONSpace(body))}, true
}

// ParseCreateTaskAnswer reads createTask's answer
// {"errorId":0,"taskId":<id>}, the id a JSON number or string, returned as
// a string. A synchronous answer (CapSolver: "status":"ready" with the
// solution, https://docs.capsolver.com/guide/api-createtask) also returns
// the result, its Raw the whole answer.
func ParseCreateTaskAnswer(body []byte) (id string, sync *Answer, ok bool) {
	var ta taskAnswer
	if !isObject(body) || json.Unmarshal(body, &ta) != nil {
		return "", nil, false
	}
	if n, ok := errorID(ta.ErrorID); !ok || n != 0 || ta.TaskID == nil {
		return "", nil, false
	}
	if id, ok = jsonID(ta.TaskID); !ok {
		return "", nil, false
	}
	if ta.Status == "ready" {
		if a, ok := solutionAnswer(ta, body); ok {
			sync = &a
		}
	}
	return id, sync, true
}

// ParseTaskResult parses a getTaskResult answer: errorId 0 with status
// "processing" (NotReady) or "ready" and a solution (Result: Code is the
// canonical JSON of solution, Raw the whole answer); errorId above 0 with
// errorCode, classified (a task-final error keeps Raw too). Anything else
// is ErrNotProtocol.
func ParseTaskResult(body []byte) (Answer, error) {
	var ta taskAnswer
	if !isObject(body) || json.Unmarshal(body, &ta) != nil {
		return Answer{}, fmt.Errorf("getTaskResult: %w (%d bytes)", ErrNotProtocol, len(body))
	}
	n, ok := errorID(ta.ErrorID)
	switch {
	case !ok || ta.ErrorID == nil:
		return Answer{}, fmt.Errorf("getTaskResult: %w: no errorId", ErrNotProtocol)
	case n > 0:
		if ta.ErrorCode == "" {
			return Answer{Kind: Backoff, Code: "errorId " + strconv.FormatInt(n, 10)}, nil
		}
		a := ClassifyJSONError(ta.ErrorCode)
		if a.Kind == TaskError {
			a.Raw = bytes.Clone(trimJSONSpace(body))
		}
		return a, nil
	case ta.Status == "processing":
		return Answer{Kind: NotReady, Code: "processing"}, nil
	case ta.Status == "ready":
		if a, ok := solutionAnswer(ta, body); ok {
			return a, nil
		}
	}
	return Answer{}, fmt.Errorf("getTaskResult: %w: status %q", ErrNotProtocol, ta.Status)
}

// SeenTaskResult reads a result or a task-final error from a getTaskResult
// answer the app asked for itself.
func SeenTaskResult(body []byte) (Answer, bool) {
	a, err := ParseTaskResult(body)
	return a, err == nil && a.Final()
}

// ParseGetTaskResultRequest reads getTaskResult's request body
// {"clientKey":"...","taskId":<id>}, the id a number or a string.
func ParseGetTaskResultRequest(body []byte) (clientKey, taskID string, ok bool) {
	var v struct {
		ClientKey string          `json:"clientKey"`
		TaskID    json.RawMessage `json:"taskId"`
	}
	if !isObject(body) || json.Unmarshal(body, &v) != nil || v.TaskID == nil {
		return "", "", false
	}
	taskID, ok = jsonID(v.TaskID)
	return v.ClientKey, taskID, ok
}

// GetTaskResultRequest is the body of the plugin's own getTaskResult call.
func (p Provider) GetTaskResultRequest(clientKey, taskID string) []byte {
	b := []byte(`{"clientKey":`)
	b = append(b, quote(clientKey)...)
	b = append(b, `,"taskId":`...)
	b = append(b, p.taskIDJSON(taskID)...)
	return append(b, '}')
}

// taskIDJSON is the id as the provider's JSON carries it: a number for
// numeric ids, else a string.
func (p Provider) taskIDJSON(id string) []byte {
	if p.NumericTaskID && validDigits(id) {
		return []byte(id)
	}
	return quote(id)
}

// JSONCallbackBody is the body of a JSON callback for task id whose
// getTaskResult answer is raw: that answer with "taskId" (a number for
// anti-captcha and CapMonster, a string for CapSolver) as its first
// member, unless the answer has one already. The anti-captcha family sends
// "the same content as getTaskResult"
// (https://docs.capmonster.cloud/docs/api/methods/create-task) keyed by
// taskId.
func (p Provider) JSONCallbackBody(id string, raw []byte) []byte {
	raw = trimJSONSpace(raw)
	has := false
	if eachMember(raw, func(k string, _ json.RawMessage) { has = has || k == "taskId" }) != nil {
		return nil
	}
	if has {
		return bytes.Clone(raw)
	}
	i := bytes.IndexByte(raw, '{') + 1
	member := append([]byte(`"taskId":`), p.taskIDJSON(id)...)
	if len(bytes.TrimSpace(raw[i:])) > 1 { // not "{}"
		member = append(member, ',')
	}
	out := make([]byte, 0, len(raw)+len(member))
	out = append(out, raw[:i]...)
	out = append(out, member...)
	return append(out, raw[i:]...)
}

// LocalTaskResult returns the answer to getTaskResult for a result the
// plugin holds, when the kept answer raw has getTaskResult's shape (a
// JSON object with a numeric errorId: 0 with status "ready" and a
// solution, or above 0 with an errorCode): raw, byte for byte. ok is false
// otherwise (a result that came as a form callback), and the request is
// then passed through.
func LocalTaskResult(raw []byte) ([]byte, bool) {
	var ta taskAnswer
	if !isObject(raw) || json.Unmarshal(raw, &ta) != nil || ta.ErrorID == nil {
		return nil, false
	}
	var n json.Number
	if ta.ErrorID[0] == '"' || json.Unmarshal(ta.ErrorID, &n) != nil {
		return nil, false // errorId must be a JSON number for the clients
	}
	switch {
	case n.String() == "0" && ta.Status == "ready" && len(ta.Solution) > 0 && string(ta.Solution) != "null":
	case n.String() != "0" && ta.ErrorCode != "":
	default:
		return nil, false
	}
	return raw, true
}

// FormCode is the code of a form (id/code) callback for a JSON solution:
// its token (the member "token", "gRecaptchaResponse" or "text", or its only
// member when that is a string), else the solution's canonical JSON. The
// 2captcha API v2 documents no callback format; this is the code its form
// pingback carries for the same task type in API v1.
func FormCode(solution []byte) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(solution, &m) == nil {
		for _, k := range []string{"token", "gRecaptchaResponse", "text"} {
			var s string
			if json.Unmarshal(m[k], &s) == nil && s != "" {
				return s
			}
		}
		if len(m) == 1 {
			for _, v := range m {
				var s string
				if json.Unmarshal(v, &s) == nil {
					return s
				}
			}
		}
	}
	code, err := CanonicalJSON(solution)
	if err != nil {
		return string(solution)
	}
	return code
}

// Solution returns the solution member of a kept getTaskResult answer.
func Solution(raw []byte) []byte {
	var ta taskAnswer
	if json.Unmarshal(raw, &ta) != nil {
		return nil
	}
	return ta.Solution
}

// isObject reports whether body is one valid JSON object.
func isObject(body []byte) bool {
	b := trimJSONSpace(body)
	return len(b) > 1 && b[0] == '{' && b[len(b)-1] == '}' && json.Valid(body)
}

// trimJSONSpace trims JSON's insignificant whitespace (RFC 8259: space,
// tab, CR, LF) from both ends.
func trimJSONSpace(b []byte) []byte { return bytes.Trim(b, " \t\r\n") }
