package captchasim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The JSON API: createTask, getTaskResult and getBalance, POST with JSON
// bodies carrying clientKey (source: docs/protocols.md §6). Error answers
// carry errorId, errorCode and errorDescription with anti-captcha's
// numbering (§6.3).

// JSON flavors (Config.JSONFlavor).
const (
	FlavorAntiCaptcha = "anticaptcha"
	FlavorCapSolver   = "capsolver"
	Flavor2Captcha    = "2captcha"
)

// JSON API error codes used by the simulator (source: docs/protocols.md §6.3).
const (
	CodeKeyDoesNotExist = "ERROR_KEY_DOES_NOT_EXIST"
	CodeNoSuchCaptchaID = "ERROR_NO_SUCH_CAPCHA_ID"
	CodeTooMuchRequests = "ERROR_TOO_MUCH_REQUESTS"
	CodeTaskAbsent      = "ERROR_TASK_ABSENT"
)

var jsonErrorIDs = map[string]int{
	CodeKeyDoesNotExist: 1,
	CodeNoSlot:          2,
	CodeTooMuchRequests: 3,
	CodeZeroBalance:     10,
	CodeUnsolvable:      12,
	CodeNoSuchCaptchaID: 16,
	CodeTaskAbsent:      20,
	CodeIPBlocked:       21,
}

// jsonError is a JSON API error answer.
func jsonError(code string) map[string]any {
	return map[string]any{"errorId": jsonErrorIDs[code], "errorCode": code, "errorDescription": "simulated: " + code}
}

// jsonRequest is what the simulator reads of a JSON API request.
type jsonRequest struct {
	ClientKey   string          `json:"clientKey"`
	Task        json.RawMessage `json:"task"`
	TaskID      json.RawMessage `json:"taskId"`
	CallbackURL string          `json:"callbackUrl"`
}

// serveJSON answers createTask, getTaskResult and getBalance. clientKey
// names the account (Config.Key or one of Config.Keys); any other is
// ERROR_KEY_DOES_NOT_EXIST. getTaskResult answers ERROR_NO_SUCH_CAPCHA_ID
// for a task of another account, as for an unknown one. A key with a
// KeyFault.JSONCode is answered that code (createTask only with Submits).
func (s *Sim) serveJSON(w http.ResponseWriter, r *http.Request, method string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	var req jsonRequest
	if err != nil || json.Unmarshal(body, &req) != nil {
		writeJSON(w, map[string]any{"errorId": 8, "errorCode": "ERROR_NO_REQUEST_METHOD", "errorDescription": "simulated: body is not a JSON object"})
		return
	}
	s.mu.Lock()
	now := s.cfg.Now()
	s.sweepLocked(now)
	a := s.byKey[req.ClientKey]
	var answer any
	fault := 0
	switch method {
	case "createTask":
		s.st.CreateTaskCalls++
		if a != nil {
			a.st.CreateTaskCalls++
		}
		answer, fault = s.createTaskLocked(a, req, now)
	case "getTaskResult":
		s.st.GetTaskResultCalls++
		if a != nil {
			a.st.GetTaskResultCalls++
		}
		answer, fault = s.getTaskResultLocked(a, req, now)
	default:
		if a == nil {
			answer = jsonError(CodeKeyDoesNotExist)
		} else if code := jsonFaultLocked(a); code != "" {
			answer = jsonError(code)
		} else {
			b, _ := strconv.ParseFloat(s.cfg.Balance, 64)
			answer = map[string]any{"errorId": 0, "balance": b}
		}
	}
	s.mu.Unlock()
	if fault != 0 {
		writeServerError(w, fault)
		return
	}
	if b, ok := answer.([]byte); ok {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
		return
	}
	writeJSON(w, answer)
}

// createTaskLocked accepts a task for account a (nil: the key is not
// accepted). s.mu must be held.
func (s *Sim) createTaskLocked(a *account, req jsonRequest, now time.Time) (any, int) {
	if s.chance(s.cfg.SubmitServerErrorRate) {
		s.st.ServerErrors++
		return nil, serverErrorStatuses[s.rng.IntN(len(serverErrorStatuses))]
	}
	if a == nil {
		s.st.SubmitErrors++
		return jsonError(CodeKeyDoesNotExist), 0
	}
	if a.fault.Submits {
		if code := jsonFaultLocked(a); code != "" {
			s.st.SubmitErrors++
			return jsonError(code), 0
		}
	}
	var task struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(req.Task, &task) != nil || task.Type == "" {
		s.st.SubmitErrors++
		return jsonError(CodeTaskAbsent), 0
	}
	if s.chance(s.cfg.SubmitNoSlotRate) {
		s.st.NoSlots++
		s.st.SubmitErrors++
		return jsonError(CodeNoSlot), 0
	}
	callback := ""
	if validPingback(req.CallbackURL) {
		callback = req.CallbackURL
	}
	t := s.newTaskLocked(a, methodForType(task.Type), callback, now, true)
	if s.cfg.JSONFlavor == FlavorCapSolver {
		if strings.HasPrefix(task.Type, "ImageToText") {
			// Answered in createTask itself, never called back.
			if t.timer != nil {
				t.timer.Stop()
			}
			t.pingback = ""
			s.st.TasksPending--
			s.st.TasksSolved++
			t.state, t.unsolv, t.solved = StateSolved, false, now
			a := s.resultLocked(t)
			a["taskId"] = t.id
			return a, 0
		}
	}
	s.log.Info("task created", "id", t.id, "account", a.index, "type", task.Type, "callback", callback != "")
	return map[string]any{"errorId": 0, "taskId": s.taskIDValue(t.id)}, 0
}

// taskIDValue is the id as the flavor's JSON carries it.
func (s *Sim) taskIDValue(id string) any {
	if s.cfg.JSONFlavor == FlavorCapSolver {
		return id
	}
	return json.Number(id)
}

// methodForType maps a task type to the in.php method of the same answer
// shape (source: docs/protocols.md §1.5).
func methodForType(typ string) string {
	l := strings.ToLower(typ)
	switch {
	case strings.HasPrefix(l, "imagetotext"):
		return "post"
	case strings.Contains(l, "funcaptcha"):
		return "funcaptcha"
	case strings.Contains(l, "turnstile"):
		return "turnstile"
	case strings.Contains(l, "hcaptcha"):
		return "hcaptcha"
	}
	return "userrecaptcha"
}

// getTaskResultLocked answers getTaskResult for account a (nil: the key
// is not accepted). s.mu must be held.
func (s *Sim) getTaskResultLocked(a *account, req jsonRequest, now time.Time) (any, int) {
	if s.chance(s.cfg.ServerErrorRate) {
		s.st.ServerErrors++
		return nil, serverErrorStatuses[s.rng.IntN(len(serverErrorStatuses))]
	}
	if a == nil {
		return jsonError(CodeKeyDoesNotExist), 0
	}
	if code := jsonFaultLocked(a); code != "" {
		return jsonError(code), 0
	}
	var id string
	if json.Unmarshal(req.TaskID, &id) != nil {
		var n json.Number
		if json.Unmarshal(req.TaskID, &n) != nil {
			return jsonError(CodeNoSuchCaptchaID), 0
		}
		id = n.String()
	}
	t := s.lookupLocked(id, now)
	if t == nil || !t.api || !ownsLocked(a, t) {
		return jsonError(CodeNoSuchCaptchaID), 0
	}
	s.touchLocked(t)
	if s.cfg.MaxResultCalls > 0 && t.resCalls > int64(s.cfg.MaxResultCalls) {
		s.st.ResultLimitExceeded++
		return jsonError(CodeTooMuchRequests), 0
	}
	if s.chance(s.cfg.NoSlotRate) {
		s.st.NoSlots++
		return jsonError(CodeNoSlot), 0
	}
	switch t.state {
	case StatePending:
		return map[string]any{"errorId": 0, "status": "processing"}, 0
	case StateUnsolvable:
		return jsonError(CodeUnsolvable), 0
	}
	return s.resultLocked(t), 0
}

// resultLocked is the getTaskResult answer of a solved task. s.mu must be
// held.
func (s *Sim) resultLocked(t *task) map[string]any {
	var solution map[string]any
	switch t.method {
	case "post":
		solution = map[string]any{"text": t.answer}
	default:
		solution = map[string]any{"gRecaptchaResponse": t.answer}
		if s.cfg.JSONFlavor == Flavor2Captcha {
			solution["token"] = t.answer
		}
	}
	return map[string]any{
		"errorId": 0, "status": "ready", "solution": solution,
		"cost": "0.00095", "ip": "203.0.113.7",
		"createTime": t.submitted.Unix(), "endTime": t.solved.Unix(), "solveCount": 1,
	}
}

// jsonCallbackLocked returns the call that delivers t's callback: the
// getTaskResult answer with taskId (POST application/json), or the form
// id=&code= for the 2captcha flavor's form callbacks. s.mu must be held.
func (s *Sim) jsonCallbackLocked(t *task) func(context.Context) (int, error) {
	var answer map[string]any
	if t.unsolv {
		answer = jsonError(CodeUnsolvable)
	} else {
		answer = s.resultLocked(t)
	}
	if s.cfg.JSONCallback == "form" {
		code := t.answer
		if t.unsolv {
			code = CodeUnsolvable
		}
		body := "id=" + url.QueryEscape(t.id) + "&code=" + url.QueryEscape(code)
		return s.postCallback(t.pingback, "application/x-www-form-urlencoded", []byte(body))
	}
	withID := map[string]any{"taskId": s.taskIDValue(t.id)}
	for k, v := range answer {
		withID[k] = v
	}
	body, _ := json.Marshal(withID)
	return s.postCallback(t.pingback, "application/json", body)
}

func (s *Sim) postCallback(rawURL, contentType string, body []byte) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, rawURL, bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", contentType)
		return s.send(req)
	}
}
