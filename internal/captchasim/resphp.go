package captchasim

import (
	"net/http"
	"strings"
	"time"
)

// result is a res.php answer computed under s.mu and written after it is
// released.
type result struct {
	// httpStatus, when non-zero, makes this an injected HTML error page.
	httpStatus int
	// ok selects a success answer (JSON status 1) over a code (status 0).
	ok bool
	// okPrefix prefixes plain success answers with "OK|".
	okPrefix bool
	// text is the answer or code; price is appended for get2.
	text, price string
}

// codeResult answers a bare code (JSON status 0).
func codeResult(code string) result { return result{text: code} }

// write sends r in plain or JSON form.
func (r result) write(w http.ResponseWriter, asJSON bool) {
	switch {
	case r.httpStatus != 0:
		writeServerError(w, r.httpStatus)
	case !r.ok:
		writeCode(w, asJSON, r.text)
	case r.price != "" && asJSON:
		writeJSON(w, reply{Status: 1, Request: r.text, Price: r.price})
	case r.price != "":
		writePlain(w, "OK|"+r.text+"|"+r.price)
	default:
		writeOK(w, asJSON, r.okPrefix, r.text)
	}
}

// resActions are the res.php actions the simulator implements; any other
// action is counted as "other" in Stats.ResCallsByAction, and a missing one
// as "none".
var resActions = map[string]bool{
	"get": true, "get2": true, "getbalance": true, "reportgood": true, "reportbad": true,
}

// serveRes handles res.php (source: docs/protocols.md §1.4). Parameters
// (GET query or POST body): key, action, id, ids, json (0/1). Actions:
//
//	get&id=ID         OK|<answer> | CAPCHA_NOT_READY | ERROR_CAPTCHA_UNSOLVABLE
//	                  json=1: {"status":1,"request":"<answer>"} |
//	                  {"status":0,"request":"CAPCHA_NOT_READY"}
//	get&ids=A,B,C     <a>|CAPCHA_NOT_READY|<c>, one element per id in id order:
//	                  the answer, CAPCHA_NOT_READY, ERROR_CAPTCHA_UNSOLVABLE or
//	                  ERROR_WRONG_CAPTCHA_ID; json=1: {"status":1,"request":"a|CAPCHA_NOT_READY|c"}
//	get2&id=ID        OK|<answer>|<price>; json=1: {"status":1,"request":"<answer>","price":"<price>"}
//	getbalance        <balance>; json=1: {"status":1,"request":"<balance>"}
//	reportgood&id=ID  OK_REPORT_RECORDED; ERROR_REPORT_NOT_RECORDED for a task
//	reportbad&id=ID   that is not solved; ERROR_DUPLICATE_REPORT for a second report
//
// Errors for every action: ERROR_WRONG_ID_FORMAT (id not all digits),
// ERROR_WRONG_CAPTCHA_ID (unknown or forgotten id, or a task of another
// account), ERROR_WRONG_USER_KEY (key missing or not accepted),
// ERROR_EMPTY_ACTION (no action), ERROR_BAD_PARAMETERS (unknown action or
// unreadable body), and the injected faults checked in this order:
// ServerErrorRate (HTML 5xx), the key's KeyFault.Code, the account's
// budget rule (ERROR: 1005, §1.6), NoSlotRate (ERROR_NO_SLOT_AVAILABLE),
// BulkMismatchRate.
func (s *Sim) serveRes(w http.ResponseWriter, r *http.Request) {
	p, perr := parseParams(w, r)
	asJSON := p.get("json") == "1"
	action := p.get("action")
	now := s.cfg.Now()

	s.mu.Lock()
	res := s.resLocked(p, perr, action, now)
	s.mu.Unlock()

	if res.httpStatus != 0 {
		s.log.Info("res.php: injected server error", "action", action, "status", res.httpStatus)
	} else {
		s.log.Debug("res.php", "action", action, "id", p.get("id"), "ids", p.get("ids"), "answer", res.text)
	}
	res.write(w, asJSON)
}

// resLocked counts a res.php request, applies faults and dispatches the
// action. s.mu must be held.
func (s *Sim) resLocked(p params, perr error, action string, now time.Time) result {
	s.sweepLocked(now)
	a := s.byKey[p.get("key")]
	charged := a
	s.st.ResCalls++
	if a != nil {
		a.st.ResCalls++
	} else {
		s.st.UnknownKeyResCalls++
		charged = s.accounts[0]
	}
	by := "other"
	switch {
	case action == "":
		by = "none"
	case resActions[action]:
		by = action
	}
	s.st.ResCallsByAction[by]++
	bulk := action == "get" && p.get("ids") != ""
	if bulk {
		s.st.BulkCalls++
	}
	if a != nil {
		a.st.ResCallsByAction[by]++
		if bulk {
			a.st.BulkCalls++
		}
	}

	if s.chance(s.cfg.ServerErrorRate) {
		s.st.ServerErrors++
		return result{httpStatus: serverErrorStatuses[s.rng.IntN(len(serverErrorStatuses))]}
	}
	if code := resFaultLocked(a); code != "" {
		return codeResult(code)
	}
	if s.overBudgetLocked(charged, now) {
		s.st.BudgetBlocks++
		if a != nil {
			a.st.BudgetBlocks++
		}
		return codeResult(CodeBudget)
	}
	switch {
	case perr != nil:
		return codeResult(CodeBadParameters)
	case a == nil:
		return codeResult(CodeWrongUserKey)
	case action == "":
		return codeResult(CodeEmptyAction)
	case !resActions[action]:
		return codeResult(CodeBadParameters)
	}
	if s.chance(s.cfg.NoSlotRate) {
		s.st.NoSlots++
		return codeResult(CodeNoSlot)
	}

	switch action {
	case "getbalance":
		return result{ok: true, text: s.cfg.Balance}
	case "reportgood", "reportbad":
		return s.reportLocked(a, p.get("id"), now)
	case "get2":
		res := s.getLocked(a, p.get("id"), now)
		if res.ok {
			res.price = s.cfg.Price
		}
		return res
	}
	if bulk {
		return s.bulkGetLocked(a, p.get("ids"), now)
	}
	return s.getLocked(a, p.get("id"), now)
}

// overBudgetLocked applies the 2captcha rule R > C*20 + 1200 (source:
// docs/protocols.md §1.6, ERROR: 1005) to account a with the configured
// per-task allowance and fixed allowance, and the optional BudgetBlockFor.
// R is a's res.php requests, plus those without an accepted key for
// account 0; C is a's tasks. s.mu must be held and the current request
// already counted.
func (s *Sim) overBudgetLocked(a *account, now time.Time) bool {
	if !s.cfg.EnforceBudget {
		return false
	}
	if now.Before(a.budgetUntil) {
		return true
	}
	calls := a.st.ResCalls
	if a.index == 0 {
		calls += s.st.UnknownKeyResCalls
	}
	limit := a.st.Submits*int64(s.cfg.BudgetPerTask) + int64(s.cfg.BudgetAllowance)
	if calls <= limit {
		return false
	}
	if s.cfg.BudgetBlockFor > 0 {
		a.budgetUntil = now.Add(s.cfg.BudgetBlockFor)
	}
	return true
}

// touchLocked counts one res.php call against t. s.mu must be held.
func (s *Sim) touchLocked(t *task) {
	t.resCalls++
	s.perTaskSum++
	if t.resCalls > s.st.ResCallsPerTaskMax {
		s.st.ResCallsPerTaskMax = t.resCalls
	}
}

// askedLocked finds the task id that account a asks res.php about, and
// counts the call on it (touchLocked). Without one it returns nil and the
// error to answer: ERROR_WRONG_ID_FORMAT for a malformed id,
// ERROR_WRONG_CAPTCHA_ID for an unknown one or another account's. s.mu
// must be held.
func (s *Sim) askedLocked(a *account, id string, now time.Time) (*task, result) {
	if !isDigits(id) {
		return nil, codeResult(CodeWrongIDFormat)
	}
	t := s.lookupLocked(id, now)
	if t == nil || !ownsLocked(a, t) {
		return nil, codeResult(CodeWrongCaptchaID)
	}
	s.touchLocked(t)
	return t, result{}
}

// getLocked answers action=get for one id asked by account a. s.mu must
// be held.
func (s *Sim) getLocked(a *account, id string, now time.Time) result {
	t, fail := s.askedLocked(a, id, now)
	if t == nil {
		return fail
	}
	switch t.state {
	case StateSolved:
		return result{ok: true, okPrefix: true, text: t.answer}
	case StateUnsolvable:
		return codeResult(CodeUnsolvable)
	}
	return codeResult(CodeNotReady)
}

// bulkGetLocked answers action=get&ids=a,b,c: one element per id, in id
// order, joined with '|' (source: docs/protocols.md §1.4); an id of
// another account than a's is ERROR_WRONG_CAPTCHA_ID, as an unknown one.
// Any malformed id fails the whole request with ERROR_WRONG_ID_FORMAT.
// s.mu must be held.
func (s *Sim) bulkGetLocked(a *account, rawIDs string, now time.Time) result {
	ids := strings.Split(rawIDs, ",")
	for i, id := range ids {
		ids[i] = strings.TrimSpace(id)
		if !isDigits(ids[i]) {
			return codeResult(CodeWrongIDFormat)
		}
	}
	elems := make([]string, 0, len(ids)+1)
	for _, id := range ids {
		t := s.lookupLocked(id, now)
		switch {
		case t == nil || !ownsLocked(a, t):
			elems = append(elems, CodeWrongCaptchaID)
			continue
		case t.state == StateSolved:
			elems = append(elems, t.answer)
		case t.state == StateUnsolvable:
			elems = append(elems, CodeUnsolvable)
		default:
			elems = append(elems, CodeNotReady)
		}
		s.touchLocked(t)
	}
	if s.chance(s.cfg.BulkMismatchRate) {
		s.st.BulkMismatches++
		if len(elems) > 1 {
			i := s.rng.IntN(len(elems))
			elems = append(elems[:i], elems[i+1:]...)
		} else {
			elems = append(elems, CodeNotReady)
		}
	}
	return result{ok: true, text: strings.Join(elems, "|")}
}

// reportLocked answers reportgood/reportbad (source: docs/protocols.md
// §1.4) for account a. s.mu must be held.
func (s *Sim) reportLocked(a *account, id string, now time.Time) result {
	t, fail := s.askedLocked(a, id, now)
	if t == nil {
		return fail
	}
	switch {
	case t.state != StateSolved:
		return codeResult(CodeReportNotRecorded)
	case t.reported:
		return codeResult(CodeDuplicateReport)
	}
	t.reported = true
	return result{ok: true, text: CodeReportRecorded}
}
