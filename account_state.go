package pingback

import (
	"errors"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/caddy-pingback/pingback/internal/store"
)

// accountState is the poller's process-wide state for one account of a
// provider (one API key), kept in the pooled store handle so it survives
// config reloads. The providers' limits are per account (2captcha counts
// its res.php allowance per key, a ban or ERROR_NO_SLOT_AVAILABLE applies
// to the key that got it), so the rate limiter, the back-off and the
// in-process budget are each account's own: one account banned or out of
// allowance does not slow another's polls.
type accountState struct {
	limiter *rate.Limiter

	mu           sync.Mutex
	blockedUntil time.Time
	failures     int  // consecutive backoff answers
	stopped      bool // the provider rejected the account's key
	polls        int  // res.php and getTaskResult requests since start
	tracked      int  // tasks tracked since start
	budgetLogged bool
}

// account returns the state of the account, creating it.
func (h *storeHandle) account(acct store.Account) *accountState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.accounts == nil {
		h.accounts = make(map[store.Account]*accountState)
	}
	as := h.accounts[acct]
	if as == nil {
		as = &accountState{limiter: rate.NewLimiter(rate.Limit(DefaultPollRate), int(DefaultPollRate))}
		h.accounts[acct] = as
	}
	return as
}

// ok resets the back-off after an answer that was not a refusal.
func (as *accountState) ok() {
	as.mu.Lock()
	as.failures = 0
	as.mu.Unlock()
}

// setOnce sets flag, one of as's flags (stopped, budgetLogged), and
// reports whether it was unset: true only the first time, for what
// happens once (a log line).
func (as *accountState) setOnce(flag *bool) bool {
	as.mu.Lock()
	defer as.mu.Unlock()
	first := !*flag
	*flag = true
	return first
}

// overBudget reports whether the account's in-process res.php budget,
// shared by the poller and the confirmations, is spent.
func (as *accountState) overBudget() bool {
	as.mu.Lock()
	defer as.mu.Unlock()
	return overPollBudget(as.polls, as.tracked)
}

// errAccountHeld: the account may not ask the provider now.
var errAccountHeld = errors.New("the account is held back: its key was rejected, or the provider asked it to back off")

// held returns errAccountHeld while the provider rejected the account's
// key or its back-off lasts, else nil: a confirmation honours them as the
// poller does.
func (as *accountState) held(now time.Time) error {
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.stopped || now.Before(as.blockedUntil) {
		return errAccountHeld
	}
	return nil
}

// countPoll counts one result request made with the account's key.
func (as *accountState) countPoll() {
	as.mu.Lock()
	as.polls++
	as.mu.Unlock()
}
