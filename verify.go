package pingback

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// The verify modes and unknown_ids policies.
//
// Verification of pingbacks. Providers do not sign pingbacks and task ids
// are nearly sequential, so anyone who can reach the pingback route could
// otherwise hand the app a result. The pingback handler decides, before
// it stores a pingback, whether it is delivered or kept in quarantine:
//
//   - verify token: a pingback for a task tracked with a token must carry
//     it (pingback_track adds it to the pingback URL of each submission);
//   - verify res_php: the code is confirmed with one result request to the
//     provider (res.php or getTaskResult) before delivery;
//   - verify none: nothing is checked;
//
// and for ids no submission produced, unknown_ids accept, quarantine or
// reject. Defaults are static per config: token and quarantine for a
// provider that has a pingback_track in the config, none and accept
// otherwise.
const (
	VerifyToken  = store.VerifiedToken
	VerifyResPHP = store.VerifiedResPHP
	VerifyNone   = store.VerifiedNone

	UnknownAccept     = "accept"
	UnknownQuarantine = "quarantine"
	UnknownReject     = "reject"
)

// Why a record is quarantined (store.Record.Quarantine).
const (
	whyTokenMismatch = "token_mismatch"
	whyUnknownID     = "unknown_id"
	// A result received before its task's submission entered
	// pingback_track: it never completes the task (set when the task
	// commits and finds it quarantined as an unknown id).
	whyBeforeSubmission = "before_submission"
	whyConfirming       = "confirming"
	whyNotConfirmed     = "not_confirmed"
	whyProvider         = "provider_mismatch"
	// verify res_php, a task without a token whose account's key this
	// Caddy does not have: nothing can verify it.
	whyUnverified = "unverified"
)

// confirmTries is how many times a result request that answers "not
// ready" is asked again before the result is quarantined as unconfirmed;
// confirmGap is the wait before each (3 × 5 s: about 15 s, the providers'
// "wait at least 5 seconds" between result calls).
const (
	confirmTries = 3
	confirmGap   = 5 * time.Second
)

// confirmAfter waits d for a confirmation retry (askUntilFinal): false if
// ctx ended first. App.confirmWait, when set (tests), waits instead.
func (a *App) confirmAfter(ctx context.Context, d time.Duration) bool {
	if a.confirmWait != nil {
		return a.confirmWait(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// provisionVerify checks the handler's verify and unknown_ids settings.
func (h *Handler) provisionVerify() error {
	h.resolved = new(handlerModes)
	switch h.Verify {
	case "", VerifyToken, VerifyNone:
	case VerifyResPHP:
		if len(h.app.providerConfig(h.Provider).APIKey) == 0 {
			return fmt.Errorf("verify res_php needs the provider's api_key (global pingback option: provider %s { api_key ... })", h.Provider)
		}
	default:
		return fmt.Errorf("verify must be token, res_php or none, got %q", h.Verify)
	}
	switch h.UnknownIDs {
	case "", UnknownAccept, UnknownQuarantine, UnknownReject:
	default:
		return fmt.Errorf("unknown_ids must be accept, quarantine or reject, got %q", h.UnknownIDs)
	}
	if h.MaxQuarantine == 0 {
		h.MaxQuarantine = DefaultMaxQuarantine
	}
	if h.MaxQuarantineBytes == 0 {
		h.MaxQuarantineBytes = DefaultMaxQuarantineBytes
	}
	if h.MaxQuarantine < 0 || h.MaxQuarantineBytes < 0 {
		return fmt.Errorf("max_quarantine must be positive, got %d records, %d bytes", h.MaxQuarantine, h.MaxQuarantineBytes)
	}
	return nil
}

// modes returns the handler's verify mode and unknown_ids policy, the
// defaults resolved once the whole config is provisioned (a
// pingback_track of the provider anywhere in it makes them token and
// quarantine).
func (h *Handler) modes() (verify, unknown string) {
	m := h.resolved
	m.once.Do(func() {
		tracked := h.app.hasTracker(h.Provider)
		m.verify, m.unknown = h.Verify, h.UnknownIDs
		if m.verify == "" {
			m.verify = VerifyNone
			if tracked {
				m.verify = VerifyToken
			}
		}
		if m.unknown == "" {
			m.unknown = UnknownAccept
			if tracked {
				m.unknown = UnknownQuarantine
			}
		}
	})
	return m.verify, m.unknown
}

// handlerModes are a handler's verify mode and unknown_ids policy with
// the defaults resolved.
type handlerModes struct {
	once            sync.Once
	verify, unknown string
}

// trust is what the handler does with a pingback (judge decides it).
type trust struct {
	reject   bool   // unknown id, unknown_ids reject: answered 404, nothing stored
	why      string // quarantined (or, with confirm, stored for confirmation) for this reason; "" to deliver
	confirm  bool   // ask the provider before delivering (res_php)
	verified string
	tracked  bool
	// storeErr is why the store could not judge the pingback (the task
	// read failed with another error than store.ErrNotFound, or no store
	// is open): a store failure, no verdict on the pingback; nothing else
	// is set.
	storeErr error
	// polled: the task is pending and this Caddy has its account's key,
	// so the poller fetches its result if the pingback cannot be stored.
	polled bool
}

// judge decides what becomes of a pingback for key whose request is r.
// ctx's deadline bounds the task read (and its retry after a transient
// fault); a read that fails other than with store.ErrNotFound is a store
// failure (trust.storeErr), never a quarantine reason.
func (h *Handler) judge(ctx context.Context, st store.Store, r *http.Request, key store.Key) trust {
	verify, unknown := h.modes()
	if verify == VerifyNone && unknown == UnknownAccept {
		// Nothing to check: no read of the task on this path (Insert
		// tells whether the result's task is tracked).
		return trust{verified: VerifyNone}
	}
	task, err := st.GetTask(ctx, key)
	switch {
	case errors.Is(err, store.ErrNotFound):
		switch {
		case unknown == UnknownAccept:
			return trust{verified: VerifyNone}
		case unknown == UnknownReject && !h.app.submissions.inFlight(h.Provider):
			return trust{reject: true}
		}
		// Quarantined; if its task commits later (a submission in
		// flight), the task's commit checks it again (recheckHeld).
		return trust{why: whyUnknownID, verified: VerifyNone}
	case err != nil:
		// The store failed (a restart, a failover, a timeout; the
		// PostgreSQL store has retried a transient fault once within
		// ctx's deadline): what the database was doing says nothing of
		// the pingback.
		return trust{storeErr: err}
	}
	v := trust{tracked: true, polled: task.State == store.TaskPending && h.app.taskPollable(task)}
	switch {
	case verify == VerifyNone:
		v.verified = VerifyNone
	case task.Token != "" && (verify == VerifyToken || !h.app.taskPollable(task)):
		// token, or res_php for a task of an account this Caddy has no
		// key for: the provider cannot be asked, the token judges it.
		if !tokenMatches(r.URL.RawQuery, task.Token) {
			v.why, v.verified = whyTokenMismatch, VerifyNone
			return v
		}
		v.verified = VerifyToken
	case h.app.taskPollable(task):
		// res_php, or a task without a token and its account's key to
		// ask with.
		v.confirm, v.why, v.verified = true, whyConfirming, VerifyResPHP
	case verify == VerifyResPHP:
		// res_php for a task without a token whose account's key this
		// Caddy does not have: nothing can verify it, so it is not
		// delivered unverified.
		v.why, v.verified = whyUnverified, VerifyNone
	default:
		v.verified = VerifyNone // no token, no key: accepted as it is
	}
	return v
}

// tokenMatches reports whether the query carries exactly one token, the
// task's.
func tokenMatches(rawQuery, want string) bool {
	got, n := protocol.QueryToken(rawQuery)
	return n == 1 && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
