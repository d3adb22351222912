// Package captchasim simulates a captcha-solving provider that speaks the
// legacy in.php/res.php protocol of 2captcha, rucaptcha and CaptchaAI
// (source: docs/protocols.md §1) and the JSON createTask/getTaskResult API
// of anti-captcha, CapMonster, CapSolver and 2captcha API v2 (§6),
// including pingback and callback delivery (§2.1, §2.2, §2.3)
// and the faults real providers show: lost, duplicated and late pingbacks,
// HTML 5xx pages, ERROR_NO_SLOT_AVAILABLE, bulk answers of the wrong length
// and the ERROR: 1005 res.php budget (§1.6, §3).
//
// It accepts one or more API keys (Config.Key, Config.Keys), each an
// account of the provider: a task's result is given only to the key that
// submitted it, and the budget rule, bans and other account faults
// (KeyFault: SetKeyFault, BanKey) and the per-account counters
// (AccountStats: KeyStats, Accounts) are per key.
//
// A *Sim is an http.Handler. Mount it on any listener (httptest.NewServer in
// tests, cmd/captchasim for rehearsals); it answers on paths ending in
// "in.php", "res.php", "createTask", "getTaskResult", "getBalance" and
// "stats", so it can live under a prefix. It is written from the
// documentation, independently of the plugin's internal/protocol.
//
// All randomness comes from a math/rand/v2 PCG source seeded by Config.Seed;
// per-task decisions (solve delay, answer, unsolvable, pingback faults) are
// drawn once at submission, so a given seed and submission order always
// produce the same ids, answers and faults.
package captchasim

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultKey is the API key a Sim accepts when Config.Key is empty: 32
// characters, like a real 2captcha key (source: docs/protocols.md §1.2).
const DefaultKey = "5157cafe5157cafe5157cafe5157cafe"

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultForgetAfter     = 15 * time.Minute
	DefaultLateDelay       = 2 * time.Minute
	DefaultPingbackTimeout = 5 * time.Second
	DefaultPrice           = "0.00085"
	DefaultBalance         = "50.2500"
	DefaultBudgetPerTask   = 20
	DefaultBudgetAllowance = 1200
)

// Protocol answers and error codes used by the simulator (source:
// docs/protocols.md §1.3, §1.4, §1.6). Note the provider's own spelling
// of CAPCHA_NOT_READY.
const (
	CodeNotReady          = "CAPCHA_NOT_READY"
	CodeUnsolvable        = "ERROR_CAPTCHA_UNSOLVABLE"
	CodeWrongUserKey      = "ERROR_WRONG_USER_KEY"
	CodeBadParameters     = "ERROR_BAD_PARAMETERS"
	CodeWrongCaptchaID    = "ERROR_WRONG_CAPTCHA_ID"
	CodeWrongIDFormat     = "ERROR_WRONG_ID_FORMAT"
	CodeNoSlot            = "ERROR_NO_SLOT_AVAILABLE"
	CodeBudget            = "ERROR: 1005"
	CodeEmptyAction       = "ERROR_EMPTY_ACTION"
	CodeZeroFileSize      = "ERROR_ZERO_CAPTCHA_FILESIZE"
	CodeTooBigFileSize    = "ERROR_TOO_BIG_CAPTCHA_FILESIZE"
	CodeImageNotSupported = "ERROR_IMAGE_TYPE_NOT_SUPPORTED"
	CodeReportRecorded    = "OK_REPORT_RECORDED"
	CodeReportNotRecorded = "ERROR_REPORT_NOT_RECORDED"
	CodeDuplicateReport   = "ERROR_DUPLICATE_REPORT"
)

// Config configures a Sim. The zero value is usable: every field documents
// the default New applies when it is left zero. Rates are probabilities in
// [0, 1], drawn per task (pingback faults, UnsolvableRate) or per request
// (res.php/in.php faults).
type Config struct {
	// Key is the API key clients must send as `key` to in.php and res.php
	// (`clientKey` in the JSON API): account 0. A key that is neither Key
	// nor one of Keys is answered with ERROR_WRONG_USER_KEY (JSON API:
	// ERROR_KEY_DOES_NOT_EXIST). Default DefaultKey.
	Key string

	// Keys are further API keys the Sim accepts besides Key, one account
	// each: Keys[i] is account i+1. A task's result is answered only to its
	// own account's key (another accepted key gets ERROR_WRONG_CAPTCHA_ID
	// or ERROR_NO_SUCH_CAPCHA_ID); the budget rule, KeyFault and
	// AccountStats are per account. An empty entry, or a key given twice
	// (Key included), is an error. Default none: a single account.
	Keys []string

	// Seed seeds the math/rand/v2 PCG source behind every random decision
	// and the first task id. Default 0 (which is a valid, fixed seed).
	Seed uint64

	// Now is the clock used for ForgetAfter and BudgetBlockFor. Solve delays,
	// LateDelay and pingback timeouts use real timers. Default time.Now.
	Now func() time.Time

	// Logger receives Debug/Info records for submits, solves and
	// pingbacks. Default: a logger that discards everything.
	Logger *slog.Logger

	// SolveMin and SolveMax bound the uniform distribution a task's solve
	// delay is drawn from, measured from submission. Zero means the task is
	// solved as soon as its timer fires. SolveMax < SolveMin is an error.
	// Default 0 and 0.
	SolveMin, SolveMax time.Duration

	// UnsolvableRate is the probability that a task ends as
	// ERROR_CAPTCHA_UNSOLVABLE instead of an answer (source:
	// docs/protocols.md §1.6). Default 0.
	UnsolvableRate float64

	// NumericJSONIDs makes in.php answer json=1 submits of method
	// userrecaptcha with the id as a JSON number ({"status":1,"request":
	// 12345678901}) instead of a string, the CaptchaAI quirk (source:
	// docs/protocols.md §1.3). Other methods keep string ids. Default
	// false.
	NumericJSONIDs bool

	// PingbackMethod is how solved tasks are delivered to their pingback
	// URL: "POST" sends an application/x-www-form-urlencoded body
	// id=<id>&code=<code> (2captcha, source: docs/protocols.md §2.1);
	// "GET" appends ?id=<id>&code=<code> to the URL's own query (CaptchaAI
	// per its blog, §2.2). Default "POST".
	PingbackMethod string

	// PingbackTimeout bounds one pingback HTTP call. Default 5s.
	PingbackTimeout time.Duration

	// HTTPClient sends pingbacks. Default: a new http.Client with
	// PingbackTimeout as its Timeout.
	HTTPClient *http.Client

	// DropRate is the probability that a task's pingback is never sent.
	// Default 0.
	DropRate float64

	// DuplicateRate is the probability that a task's pingback is sent
	// twice, back to back. Default 0.
	DuplicateRate float64

	// LateRate is the probability that a task's pingback is held back for
	// LateDelay after the task is solved. Default 0.
	LateRate float64

	// LateDelay is how long a late pingback waits after solving. Default 2m
	// (past the ~120s token lifetime, source: docs/protocols.md §5 item 6).
	LateDelay time.Duration

	// ForgetAfter is how long after submission a task stays retrievable;
	// afterwards res.php answers ERROR_WRONG_CAPTCHA_ID (source:
	// docs/protocols.md §1.6, "results are only retrievable ~15 min").
	// Negative disables forgetting. Default 15m.
	ForgetAfter time.Duration

	// Price is the decimal price get2 reports, e.g. "0.00085" (source:
	// docs/protocols.md §1.4). Default DefaultPrice.
	Price string

	// Balance is the decimal string getbalance reports. Default
	// DefaultBalance ("50.2500").
	Balance string

	// ServerErrorRate is the probability that a res.php request is answered
	// with HTTP 500, 502 or 503 and an HTML error page (source:
	// docs/protocols.md §1.6 "Non-protocol bodies"). Default 0.
	ServerErrorRate float64

	// NoSlotRate is the probability that a res.php request is answered with
	// ERROR_NO_SLOT_AVAILABLE. Default 0.
	NoSlotRate float64

	// BulkMismatchRate is the probability that a bulk res.php get
	// (ids=a,b,c) answers with one element too few (or, for a single id,
	// one too many), as seen in the wild (source: docs/protocols.md §4,
	// KinanCity#62). Default 0.
	BulkMismatchRate float64

	// SubmitServerErrorRate is ServerErrorRate for in.php. Default 0.
	SubmitServerErrorRate float64

	// SubmitNoSlotRate is the probability that in.php answers
	// ERROR_NO_SLOT_AVAILABLE, where real providers return it (source:
	// docs/protocols.md §1.6). Default 0.
	SubmitNoSlotRate float64

	// EnforceBudget turns on the 2captcha res.php budget rule, per account:
	// a res.php request is answered ERROR: 1005 when R > C*BudgetPerTask +
	// BudgetAllowance, where R counts the account's res.php requests
	// received including this one (every action, also getbalance and
	// answered faults; requests without an accepted key count for account
	// 0) and C counts the tasks the account submitted (source:
	// docs/protocols.md §1.6). With a single key these are every request
	// and every task. Default false.
	EnforceBudget bool

	// BudgetPerTask is the per-task res.php allowance of the budget rule.
	// Negative means 0. Default 20.
	BudgetPerTask int

	// BudgetAllowance is the fixed res.php allowance of the budget rule.
	// Negative means 0 (so tests can make the rule bite at once). Default
	// 1200.
	BudgetAllowance int

	// JSONFlavor is how the JSON API (createTask, getTaskResult,
	// getBalance) behaves, after the provider it imitates (source:
	// docs/protocols.md §2.3, §6): "anticaptcha" (also CapMonster) gives
	// numeric task ids and POSTs the getTaskResult answer with a numeric
	// taskId as its callback; "capsolver" gives UUID task ids (a string
	// taskId in callbacks) and answers ImageToTextTask synchronously in
	// createTask; "2captcha" gives numeric ids, a solution with both
	// gRecaptchaResponse and token, and POSTs the form id=&code= as its
	// callback unless JSONCallback is "json". Default "anticaptcha".
	JSONFlavor string

	// JSONCallback overrides the callback form of the 2captcha flavor:
	// "form" or "json". Default: form for 2captcha, json otherwise.
	JSONCallback string

	// MaxResultCalls, if above 0, answers getTaskResult calls for one task
	// beyond this many with ERROR_TOO_MUCH_REQUESTS and counts them in
	// Stats.ResultLimitExceeded: CapMonster bans an account after 120
	// (source: docs/protocols.md §3). Default 0 (no limit).
	MaxResultCalls int

	// BudgetBlockFor keeps answering ERROR: 1005 for this long (by Now)
	// after the rule first bites for an account, to that account only, like
	// the provider's 5-minute block. Zero means only while the inequality
	// holds. Default 0.
	BudgetBlockFor time.Duration
}

// Sim is a simulated provider. Create it with New, serve it as an
// http.Handler, and Close it when done. It is safe for concurrent use.
type Sim struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client

	mu           sync.Mutex
	rng          *rand.Rand
	nextID       uint64
	tasks        map[string]*task
	order        []*task // submission order, for forgetting
	st           Stats
	perTaskSum   int64
	accounts     []*account // account order: Key, then Keys
	byKey        map[string]*account
	closed       bool
	closeCh      chan struct{}
	pingbacksRun sync.WaitGroup
}

// TaskState is the lifecycle state of a task.
type TaskState string

// Task states.
const (
	StatePending    TaskState = "pending"
	StateSolved     TaskState = "solved"
	StateUnsolvable TaskState = "unsolvable"
)

// task is one submitted captcha.
type task struct {
	id        string
	method    string
	pingback  string
	submitted time.Time
	delay     time.Duration
	answer    string // drawn at submission; returned once solved
	unsolv    bool   // drawn at submission
	drop      bool
	dup       bool
	late      bool
	state     TaskState
	timer     *time.Timer
	resCalls  int64
	reported  bool
	forgotten bool
	// api is set for a task created with createTask (JSON API); method is
	// then its task type.
	api    bool
	solved time.Time
	// account is the number of the account whose key submitted the task.
	account int
}

// TaskInfo is a snapshot of one task, for tests that need to know what the
// simulator decided.
type TaskInfo struct {
	// ID is the decimal task id in.php returned.
	ID string
	// Method is the in.php method, e.g. "userrecaptcha".
	Method string
	// Pingback is the pingback URL given at submission, or "".
	Pingback string
	// Submitted is the submission time by Config.Now.
	Submitted time.Time
	// SolveDelay is the drawn delay between submission and solving.
	SolveDelay time.Duration
	// State is the current state.
	State TaskState
	// Code is what the task ends with (known from submission): the answer,
	// or ERROR_CAPTCHA_UNSOLVABLE when Unsolvable.
	Code string
	// Unsolvable reports that the task ends as ERROR_CAPTCHA_UNSOLVABLE.
	Unsolvable bool
	// PingbackDrop, PingbackDuplicate and PingbackLate are the drawn
	// pingback faults (only meaningful when Pingback is set).
	PingbackDrop, PingbackDuplicate, PingbackLate bool
	// ResCalls counts res.php calls that named this task (get, get2,
	// bulk elements, reports) with its own account's key.
	ResCalls int64
	// Account is the number of the account whose key submitted the task: 0
	// for Config.Key, i+1 for Config.Keys[i].
	Account int
}

// New validates cfg, applies defaults and returns a ready Sim.
func New(cfg Config) (*Sim, error) {
	if cfg.Key == "" {
		cfg.Key = DefaultKey
	}
	cfg.Keys = slices.Clone(cfg.Keys)
	accounts, byKey, err := newAccounts(cfg.Key, cfg.Keys)
	if err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SolveMin < 0 || cfg.SolveMax < 0 {
		return nil, errors.New("solve delays must not be negative")
	}
	if cfg.SolveMax < cfg.SolveMin {
		return nil, fmt.Errorf("solve max %s is below solve min %s", cfg.SolveMax, cfg.SolveMin)
	}
	for name, r := range map[string]float64{
		"unsolvable rate":          cfg.UnsolvableRate,
		"drop rate":                cfg.DropRate,
		"duplicate rate":           cfg.DuplicateRate,
		"late rate":                cfg.LateRate,
		"server error rate":        cfg.ServerErrorRate,
		"no-slot rate":             cfg.NoSlotRate,
		"bulk mismatch rate":       cfg.BulkMismatchRate,
		"submit server error rate": cfg.SubmitServerErrorRate,
		"submit no-slot rate":      cfg.SubmitNoSlotRate,
	} {
		if !(r >= 0 && r <= 1) { // also rejects NaN
			return nil, fmt.Errorf("%s %v is outside [0, 1]", name, r)
		}
	}
	switch strings.ToUpper(cfg.PingbackMethod) {
	case "":
		cfg.PingbackMethod = http.MethodPost
	case http.MethodGet, http.MethodPost:
		cfg.PingbackMethod = strings.ToUpper(cfg.PingbackMethod)
	default:
		return nil, fmt.Errorf("pingback method %q is not GET or POST", cfg.PingbackMethod)
	}
	switch cfg.JSONFlavor {
	case "":
		cfg.JSONFlavor = FlavorAntiCaptcha
	case FlavorAntiCaptcha, FlavorCapSolver, Flavor2Captcha:
	default:
		return nil, fmt.Errorf("JSON flavor %q is not anticaptcha, capsolver or 2captcha", cfg.JSONFlavor)
	}
	switch cfg.JSONCallback {
	case "":
		cfg.JSONCallback = "json"
		if cfg.JSONFlavor == Flavor2Captcha {
			cfg.JSONCallback = "form"
		}
	case "form", "json":
	default:
		return nil, fmt.Errorf("JSON callback %q is not form or json", cfg.JSONCallback)
	}
	if cfg.PingbackTimeout < 0 || cfg.LateDelay < 0 || cfg.BudgetBlockFor < 0 {
		return nil, errors.New("durations must not be negative")
	}
	if cfg.PingbackTimeout == 0 {
		cfg.PingbackTimeout = DefaultPingbackTimeout
	}
	if cfg.LateDelay == 0 {
		cfg.LateDelay = DefaultLateDelay
	}
	if cfg.ForgetAfter == 0 {
		cfg.ForgetAfter = DefaultForgetAfter
	}
	if cfg.Price == "" {
		cfg.Price = DefaultPrice
	}
	if cfg.Balance == "" {
		cfg.Balance = DefaultBalance
	}
	switch {
	case cfg.BudgetPerTask == 0:
		cfg.BudgetPerTask = DefaultBudgetPerTask
	case cfg.BudgetPerTask < 0:
		cfg.BudgetPerTask = 0
	}
	switch {
	case cfg.BudgetAllowance == 0:
		cfg.BudgetAllowance = DefaultBudgetAllowance
	case cfg.BudgetAllowance < 0:
		cfg.BudgetAllowance = 0
	}
	client := cfg.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: cfg.PingbackTimeout}
	}

	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	return &Sim{
		cfg:    cfg,
		log:    cfg.Logger,
		client: client,
		rng:    rng,
		// An 11-digit first id, like 2captcha's (source: docs/protocols.md §1.3).
		nextID:   firstID + rng.Uint64N(8*firstID),
		tasks:    make(map[string]*task),
		closeCh:  make(chan struct{}),
		st:       Stats{ResCallsByAction: make(map[string]int64)},
		accounts: accounts,
		byKey:    byKey,
	}, nil
}

// firstID is the smallest 11-digit number.
const firstID = 10_000_000_000

// Config returns the effective configuration, defaults applied.
func (s *Sim) Config() Config {
	c := s.cfg
	c.Keys = slices.Clone(c.Keys)
	return c
}

// ServeHTTP routes by the last path element: in.php, res.php and stats;
// anything else is 404.
func (s *Sim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch path.Base(r.URL.Path) {
	case "in.php":
		if !allowMethods(w, r, http.MethodGet, http.MethodPost) {
			return
		}
		s.serveIn(w, r)
	case "res.php":
		if !allowMethods(w, r, http.MethodGet, http.MethodPost) {
			return
		}
		s.serveRes(w, r)
	case "stats":
		if !allowMethods(w, r, http.MethodGet) {
			return
		}
		s.serveStats(w, r)
	case "createTask", "getTaskResult", "getBalance":
		if !allowMethods(w, r, http.MethodPost) {
			return
		}
		s.serveJSON(w, r, path.Base(r.URL.Path))
	default:
		http.NotFound(w, r)
	}
}

// allowMethods answers 405 and returns false unless r uses one of methods.
func allowMethods(w http.ResponseWriter, r *http.Request, methods ...string) bool {
	for _, m := range methods {
		if r.Method == m {
			return true
		}
	}
	w.Header().Set("Allow", strings.Join(methods, ", "))
	http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	return false
}

// Task returns a snapshot of the task with the given id, or false when the
// id is unknown or already forgotten.
func (s *Sim) Task(id string) (TaskInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.lookupLocked(id, s.cfg.Now())
	if t == nil {
		return TaskInfo{}, false
	}
	code := t.answer
	if t.unsolv {
		code = CodeUnsolvable
	}
	return TaskInfo{
		ID:                t.id,
		Method:            t.method,
		Pingback:          t.pingback,
		Submitted:         t.submitted,
		SolveDelay:        t.delay,
		State:             t.state,
		Code:              code,
		Unsolvable:        t.unsolv,
		PingbackDrop:      t.drop,
		PingbackDuplicate: t.dup,
		PingbackLate:      t.late,
		ResCalls:          t.resCalls,
		Account:           t.account,
	}, true
}

// Close stops all solve timers, cancels pingbacks still waiting out
// LateDelay (counted as PingbacksCancelled), and waits for pingback calls
// already in flight (each bounded by PingbackTimeout). The handler keeps
// answering afterwards, but new tasks are never solved. Close always
// returns nil; calling it again is a no-op.
func (s *Sim) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, t := range s.tasks {
		if t.timer != nil {
			t.timer.Stop()
		}
	}
	close(s.closeCh)
	s.mu.Unlock()
	s.pingbacksRun.Wait()
	return nil
}

// chance draws one Bernoulli trial with probability p. It draws nothing for
// p <= 0 or p >= 1, so rates that are off do not shift the random sequence.
// s.mu must be held.
func (s *Sim) chance(p float64) bool {
	switch {
	case p <= 0:
		return false
	case p >= 1:
		return true
	}
	return s.rng.Float64() < p
}

// between draws a duration uniformly from [lo, hi]. s.mu must be held.
func (s *Sim) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)+1))
}

// lookupLocked returns the live task for id, forgetting it first if it has
// outlived ForgetAfter. s.mu must be held.
func (s *Sim) lookupLocked(id string, now time.Time) *task {
	t := s.tasks[id]
	if t == nil {
		return nil
	}
	if s.expired(t, now) {
		s.forgetLocked(t)
		return nil
	}
	return t
}

// expired reports whether t has outlived ForgetAfter at now.
func (s *Sim) expired(t *task, now time.Time) bool {
	return s.cfg.ForgetAfter > 0 && !now.Before(t.submitted.Add(s.cfg.ForgetAfter))
}

// forgetLocked drops t and stops its timer; a pending task is never solved.
// s.mu must be held.
func (s *Sim) forgetLocked(t *task) {
	if t.forgotten {
		return
	}
	t.forgotten = true
	if t.timer != nil {
		t.timer.Stop()
	}
	delete(s.tasks, t.id)
	s.st.TasksForgotten++
	if t.state == StatePending {
		s.st.TasksPending--
	}
	s.log.Debug("task forgotten", "id", t.id, "state", string(t.state))
}

// sweepLocked forgets expired tasks from the front of the submission queue.
// Tasks expire in submission order while the clock moves forward; a clock
// that jumps back is covered by the check in lookupLocked. s.mu must be
// held.
func (s *Sim) sweepLocked(now time.Time) {
	for len(s.order) > 0 {
		t := s.order[0]
		if !t.forgotten && !s.expired(t, now) {
			return
		}
		s.forgetLocked(t)
		s.order[0] = nil
		s.order = s.order[1:]
	}
}

// Interface guard.
var _ http.Handler = (*Sim)(nil)
