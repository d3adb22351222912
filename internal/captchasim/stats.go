package captchasim

import (
	"maps"
	"net/http"
)

// Stats are the simulator's counters since New, all accounts together
// (AccountStats splits some of them per account). GET <prefix>/stats serves
// them as JSON with the tags below, and the accounts' counters under
// "accounts".
type Stats struct {
	// InCalls counts in.php requests, accepted or not.
	InCalls int64 `json:"in_calls"`
	// Submits counts tasks accepted by in.php (C of the budget rule).
	Submits int64 `json:"submits"`
	// SubmitErrors counts in.php requests answered with an error code
	// (injected 5xx pages excluded).
	SubmitErrors int64 `json:"submit_errors"`

	// ResCalls counts res.php requests of every action, faults included
	// (R of the budget rule).
	ResCalls int64 `json:"res_calls"`
	// UnknownKeyResCalls counts the res.php requests in ResCalls whose key
	// is missing or not one the Sim accepts (the budget rule charges them to
	// account 0).
	UnknownKeyResCalls int64 `json:"unknown_key_res_calls"`
	// ResCallsByAction splits ResCalls by action: "get" (single and bulk),
	// "get2", "getbalance", "reportgood", "reportbad", "other" (unknown
	// action) and "none" (no action).
	ResCallsByAction map[string]int64 `json:"res_calls_by_action"`
	// CreateTaskCalls and GetTaskResultCalls count JSON API requests.
	CreateTaskCalls    int64 `json:"create_task_calls"`
	GetTaskResultCalls int64 `json:"get_task_result_calls"`
	// ResultLimitExceeded counts getTaskResult calls beyond
	// Config.MaxResultCalls for one task (CapMonster would ban).
	ResultLimitExceeded int64 `json:"result_limit_exceeded"`
	// BulkCalls counts action=get requests with ids=.
	BulkCalls int64 `json:"bulk_calls"`
	// ResCallsPerTaskMax is the most res.php (or getTaskResult) calls that
	// named one task.
	ResCallsPerTaskMax int64 `json:"res_calls_per_task_max"`
	// ResCallsPerTaskAvg is res.php calls that named a task (a bulk call
	// counts once per id it names) divided by Submits; 0 without submits.
	ResCallsPerTaskAvg float64 `json:"res_calls_per_task_avg"`

	// PingbacksSent counts pingback HTTP calls made, duplicates included,
	// whether they succeeded or not. It is incremented when the call
	// returns, so the receiver has seen the request by then.
	PingbacksSent int64 `json:"pingbacks_sent"`
	// PingbacksFailed counts calls in PingbacksSent that errored or got a
	// non-2xx status. Failed calls are not retried.
	PingbacksFailed int64 `json:"pingbacks_failed"`
	// PingbacksDropped counts tasks whose pingback was withheld (DropRate).
	PingbacksDropped int64 `json:"pingbacks_dropped"`
	// PingbacksDuplicated counts tasks whose pingback is sent twice
	// (DuplicateRate).
	PingbacksDuplicated int64 `json:"pingbacks_duplicated"`
	// PingbacksLate counts tasks whose pingback waits LateDelay (LateRate).
	PingbacksLate int64 `json:"pingbacks_late"`
	// PingbacksCancelled counts pingback calls Close prevented (late ones
	// still waiting, or the second call of a duplicate).
	PingbacksCancelled int64 `json:"pingbacks_cancelled"`

	// ServerErrors counts injected HTML 5xx answers (in.php and res.php).
	ServerErrors int64 `json:"server_errors"`
	// NoSlots counts injected ERROR_NO_SLOT_AVAILABLE answers (in.php and
	// res.php).
	NoSlots int64 `json:"no_slots"`
	// BulkMismatches counts bulk answers sent with a wrong element count.
	BulkMismatches int64 `json:"bulk_mismatches"`
	// BudgetBlocks counts res.php requests answered ERROR: 1005.
	BudgetBlocks int64 `json:"budget_blocks"`

	// TasksPending counts tasks accepted and not yet solved or forgotten.
	TasksPending int64 `json:"tasks_pending"`
	// TasksSolved counts tasks that reached an answer.
	TasksSolved int64 `json:"tasks_solved"`
	// TasksUnsolvable counts tasks that ended ERROR_CAPTCHA_UNSOLVABLE.
	TasksUnsolvable int64 `json:"tasks_unsolvable"`
	// TasksForgotten counts tasks dropped after ForgetAfter (solved or
	// not); they also stay counted in TasksSolved/TasksUnsolvable.
	TasksForgotten int64 `json:"tasks_forgotten"`
}

// Stats returns a snapshot of the counters, forgetting expired tasks first.
func (s *Sim) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsLocked()
}

// statsLocked is Stats. s.mu must be held.
func (s *Sim) statsLocked() Stats {
	s.sweepLocked(s.cfg.Now())
	st := s.st
	st.ResCallsByAction = maps.Clone(s.st.ResCallsByAction)
	if st.Submits > 0 {
		st.ResCallsPerTaskAvg = float64(s.perTaskSum) / float64(st.Submits)
	}
	return st
}

// statsReply is the /stats answer: Stats with the accounts beside them.
type statsReply struct {
	Stats
	Accounts []AccountStats `json:"accounts"`
}

// serveStats answers GET stats with Stats and Accounts as JSON. It does
// not count as a res.php call.
func (s *Sim) serveStats(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	reply := statsReply{Stats: s.statsLocked(), Accounts: s.accountsLocked()}
	s.mu.Unlock()
	writeJSON(w, reply)
}
