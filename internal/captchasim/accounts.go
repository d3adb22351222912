package captchasim

import (
	"errors"
	"fmt"
	"maps"
	"time"
)

// Accounts. Every API key a Sim accepts is one account of the provider:
// Config.Key is account 0 and Config.Keys[i] is account i+1. A task belongs
// to the account whose key submitted it, and the providers' limits are per
// account (source: docs/protocols.md §1.6, the res.php allowance; §3, bans):
//
//   - res.php (get, get2, bulk ids=, reportgood, reportbad) asked with
//     another account's key answers ERROR_WRONG_CAPTCHA_ID for the task, and
//     getTaskResult ERROR_NO_SUCH_CAPCHA_ID, as for an id the provider does
//     not know; a bulk answer gives that element as ERROR_WRONG_CAPTCHA_ID.
//     Such a call does not count against the task (TaskInfo.ResCalls).
//   - The budget rule (Config.EnforceBudget) is counted per account: R is
//     the res.php requests carrying the key, C the tasks it submitted, and
//     BudgetBlockFor blocks that account alone. A res.php request whose key
//     is missing or not accepted is charged to account 0, so a single-key
//     Sim counts every request, as the rule has always been read.
//   - SetKeyFault and BanKey make one account's requests fail while the
//     others are answered normally.

// Simulated fault codes for accounts (source: docs/protocols.md §1.6, §6.3).
const (
	// CodeIPBanned is the legacy API's ban (5 minutes at 2captcha).
	CodeIPBanned = "IP_BANNED"
	// CodeIPBlocked is the JSON API's ban (errorId 21).
	CodeIPBlocked = "ERROR_IP_BLOCKED"
	// CodeZeroBalance is an account without funds (errorId 10 in the JSON
	// API; the same code in res.php).
	CodeZeroBalance = "ERROR_ZERO_BALANCE"
)

// KeyFault is a fault injected for one account: while it is set, the
// account's requests are answered with its codes before anything else is
// looked at (after an injected ServerErrorRate page, which is the
// provider's front end, not the account). The zero KeyFault is no fault.
type KeyFault struct {
	// Code answers every res.php request carrying the key (every action),
	// in plain or json=1 form like any error code: for example
	// CodeIPBanned (a ban), "ERROR: 1004", CodeNoSlot, CodeZeroBalance or
	// CodeKeyDoesNotExist (a revoked key). It must be printable ASCII
	// without '|' and not start with "OK". Empty: res.php is unaffected.
	Code string
	// JSONCode answers every getTaskResult and getBalance call carrying the
	// key with {"errorId":N,"errorCode":JSONCode,...}. It must be one of
	// CodeKeyDoesNotExist (1), CodeNoSlot (2), CodeTooMuchRequests (3),
	// CodeZeroBalance (10), CodeIPBlocked (21). Empty: the JSON API is
	// unaffected.
	JSONCode string
	// Submits applies Code to in.php and JSONCode to createTask as well
	// (counted as SubmitErrors). Default false: the account can still
	// submit.
	Submits bool
}

// AccountStats are one account's counters since New. They never carry the
// key; GET <prefix>/stats serves them under "accounts", in account order.
type AccountStats struct {
	// Account is the account's number: 0 for Config.Key, i+1 for
	// Config.Keys[i].
	Account int `json:"account"`
	// InCalls counts in.php requests carrying the key, accepted or not.
	InCalls int64 `json:"in_calls"`
	// Submits counts tasks accepted for the key by in.php and createTask
	// (C of the account's budget rule).
	Submits int64 `json:"submits"`
	// ResCalls counts res.php requests carrying the key, every action,
	// faults included. R of account 0's budget rule adds
	// Stats.UnknownKeyResCalls to it.
	ResCalls int64 `json:"res_calls"`
	// ResCallsByAction splits ResCalls like Stats.ResCallsByAction.
	ResCallsByAction map[string]int64 `json:"res_calls_by_action"`
	// BulkCalls counts action=get requests with ids= carrying the key.
	BulkCalls int64 `json:"bulk_calls"`
	// CreateTaskCalls and GetTaskResultCalls count JSON API requests
	// carrying the key.
	CreateTaskCalls    int64 `json:"create_task_calls"`
	GetTaskResultCalls int64 `json:"get_task_result_calls"`
	// BudgetBlocks counts the key's res.php requests answered ERROR: 1005.
	BudgetBlocks int64 `json:"budget_blocks"`
	// FaultAnswers counts the key's requests answered with its KeyFault.
	FaultAnswers int64 `json:"fault_answers"`
	// ForeignTaskCalls counts task ids the key asked for (res.php, a bulk
	// call once per id, and getTaskResult) that belong to another
	// account's live task, answered as unknown ids.
	ForeignTaskCalls int64 `json:"foreign_task_calls"`
}

// account is one accepted key and its state.
type account struct {
	index       int
	key         string
	st          AccountStats
	budgetUntil time.Time
	fault       KeyFault
}

// newAccounts validates the keys (Key first, then Keys) and returns the
// accounts in order with an index by key. Errors name positions, never
// keys.
func newAccounts(key string, keys []string) ([]*account, map[string]*account, error) {
	all := append([]string{key}, keys...)
	list := make([]*account, 0, len(all))
	byKey := make(map[string]*account, len(all))
	for i, k := range all {
		if k == "" {
			return nil, nil, fmt.Errorf("keys[%d] is empty", i-1)
		}
		if prev, dup := byKey[k]; dup {
			return nil, nil, fmt.Errorf("%s and %s are the same key", keyName(prev.index), keyName(i))
		}
		a := &account{index: i, key: k, st: AccountStats{Account: i, ResCallsByAction: make(map[string]int64)}}
		list = append(list, a)
		byKey[k] = a
	}
	return list, byKey, nil
}

// keyName names account i's key in the Config: "key" or "keys[i-1]".
func keyName(i int) string {
	if i == 0 {
		return "key"
	}
	return fmt.Sprintf("keys[%d]", i-1)
}

// snapshot copies a's counters.
func (a *account) snapshot() AccountStats {
	st := a.st
	st.ResCallsByAction = maps.Clone(a.st.ResCallsByAction)
	return st
}

// KeyStats returns the counters of key's account, or false when key is not
// one the Sim accepts.
func (s *Sim) KeyStats(key string) (AccountStats, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.byKey[key]
	if a == nil {
		return AccountStats{}, false
	}
	return a.snapshot(), true
}

// Accounts returns every account's counters in account order (Key first,
// then Keys); it always has 1+len(Config.Keys) elements.
func (s *Sim) Accounts() []AccountStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accountsLocked()
}

// accountsLocked is Accounts. s.mu must be held.
func (s *Sim) accountsLocked() []AccountStats {
	out := make([]AccountStats, len(s.accounts))
	for i, a := range s.accounts {
		out[i] = a.snapshot()
	}
	return out
}

// jsonFaultCodes are the codes KeyFault.JSONCode may take.
var jsonFaultCodes = map[string]bool{
	CodeKeyDoesNotExist: true, CodeNoSlot: true, CodeTooMuchRequests: true, CodeZeroBalance: true, CodeIPBlocked: true,
}

// SetKeyFault sets the fault of key's account, replacing the one it had;
// the zero KeyFault lifts it. It takes effect with the next request.
// Errors: key is not one the Sim accepts, or a code is not allowed (see
// KeyFault).
func (s *Sim) SetKeyFault(key string, f KeyFault) error {
	if f.Code != "" && !validFaultCode(f.Code) {
		return fmt.Errorf("fault code %q is not printable ASCII without '|', or is an OK answer", f.Code)
	}
	if f.JSONCode != "" && !jsonFaultCodes[f.JSONCode] {
		return fmt.Errorf("json fault code %q is not one the simulator numbers", f.JSONCode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.byKey[key]
	if a == nil {
		return errors.New("key is not one of the simulator's accounts")
	}
	a.fault = f
	s.log.Info("account fault set", "account", a.index, "code", f.Code, "json_code", f.JSONCode, "submits", f.Submits)
	return nil
}

// BanKey bans key's account: every res.php and in.php request carrying it
// is answered IP_BANNED, every createTask, getTaskResult and getBalance
// call ERROR_IP_BLOCKED (errorId 21), until SetKeyFault(key, KeyFault{})
// lifts it. The provider's other accounts are unaffected. Errors: key is
// not one the Sim accepts.
func (s *Sim) BanKey(key string) error {
	return s.SetKeyFault(key, KeyFault{Code: CodeIPBanned, JSONCode: CodeIPBlocked, Submits: true})
}

// validFaultCode reports whether c can be answered as a res.php code: 1 to
// 64 printable ASCII characters, no '|', not a success answer.
func validFaultCode(c string) bool {
	if c == "" || len(c) > 64 || (len(c) >= 2 && c[:2] == "OK") {
		return false
	}
	for i := 0; i < len(c); i++ {
		if c[i] < ' ' || c[i] > '~' || c[i] == '|' {
			return false
		}
	}
	return true
}

// resFaultLocked returns a's res.php fault code, counting it, or "". a may
// be nil. s.mu must be held.
func resFaultLocked(a *account) string {
	if a == nil || a.fault.Code == "" {
		return ""
	}
	a.st.FaultAnswers++
	return a.fault.Code
}

// jsonFaultLocked returns a's JSON API fault code, counting it, or "". a
// may be nil. s.mu must be held.
func jsonFaultLocked(a *account) string {
	if a == nil || a.fault.JSONCode == "" {
		return ""
	}
	a.st.FaultAnswers++
	return a.fault.JSONCode
}

// ownsLocked reports whether t belongs to a, counting a foreign task call
// when it does not. s.mu must be held.
func ownsLocked(a *account, t *task) bool {
	if t.account == a.index {
		return true
	}
	a.st.ForeignTaskCalls++
	return false
}
