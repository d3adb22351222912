package store

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"time"
)

// Errors returned by Store implementations.
var (
	// ErrNotFound means no record exists under the key (or it expired).
	ErrNotFound = errors.New("record not found")
	// ErrClosed means the store was closed; nothing was written.
	ErrClosed = errors.New("store closed")
	// ErrSkip may be returned by an update function to leave the record
	// unchanged; the update then returns the current state and ErrSkip.
	ErrSkip = errors.New("update skipped")
	// ErrLeaseLost means the caller no longer holds the lease it tried to
	// renew: the record moved on (another attempt, another owner).
	ErrLeaseLost = errors.New("lease lost")
	// ErrTooLarge means a record is larger than MaxRecordSize; nothing
	// was written.
	ErrTooLarge = errors.New("record too large to store")
	// ErrUnavailable is returned by a write while the store refuses
	// writes (Available reports false): on Badger, while the filesystem
	// of the storage directory has less free space than min_free_space.
	// The write was refused before anything was queued: nothing of it is
	// stored. Reads still work, and writes succeed again, without a
	// restart, as soon as space is freed.
	ErrUnavailable = errors.New("storage unavailable: free space below min_free_space")
)

// MaxRecordSize is the largest record, in bytes of its stored encoding
// (request body in base64, headers, code), that every Store can always
// commit: one byte under 1 MiB, so that Badger keeps every record in its
// LSM tree, out of the value log (Badger's value threshold is at most
// 1 MiB). Sizes that reach the store (the pingback handler's max_body) are
// validated against it; see MaxBodySize.
const MaxRecordSize = 1<<20 - 1

// MaxBodySize is the largest request body a record may carry so that the
// record stays within MaxRecordSize with room for headers: 512 KiB, whose
// base64 form is 683 KiB.
const MaxBodySize = 512 << 10

// Key identifies a result: the provider's name and its task id. It is the
// deduplication key and, as "<provider>:<id>", the idempotency key the app sees.
type Key struct {
	Provider string
	ID       string
}

// String returns the idempotency key form "<provider>:<id>".
func (k Key) String() string { return k.Provider + ":" + k.ID }

// CompareKeys orders keys by provider, then id: the order in which
// PostgreSQL batches take row locks (so that two batches never wait for each
// other in a cycle) and Badger sorts the keys it lists.
func CompareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Provider, b.Provider), cmp.Compare(a.ID, b.ID))
}

// State is where a record stands in its delivery to the app.
type State string

// The states of a record.
const (
	// StateQueued: stored, waiting for its next forward from DueAt on: a
	// polled result waiting for a free forward slot, or a forward cut by a
	// config reload (not counted as a failure).
	StateQueued State = "queued"
	// StateForwarding: a forward to the app is in flight under Lease.
	StateForwarding State = "forwarding"
	// StateDelivered: the app answered 2xx or 3xx.
	StateDelivered State = "delivered"
	// StateFailed: the last forward failed in a retryable way (transport
	// error, 5xx, 408, 429, forward_timeout); retried from DueAt on.
	StateFailed State = "failed"
	// StateRejected: the app answered another 4xx; kept in the dead-letter
	// queue, never retried automatically.
	StateRejected State = "rejected"
	// StateParked: retryable failures reached max_attempts, or forwards
	// were interrupted too often in a row; kept and visible, never retried
	// automatically.
	StateParked State = "parked"
	// StateQuarantined: a result the pingback handler did not trust (a
	// token that does not match its task, an id no submission produced,
	// a code the provider's own answer contradicts, or one not yet
	// confirmed); kept and visible, never delivered unless released by
	// hand (or superseded by the provider's own answer). Its task is not
	// marked done by it.
	StateQuarantined State = "quarantined"
	// StateExpired: a result older than its provider's max_age when a
	// replay or its polled delivery was due (Delivery.ExpiredReason
	// says why); kept and visible, never forwarded automatically and
	// never retried; a replay by hand still delivers it.
	StateExpired State = "expired"
)

// States lists every state, in the order of a delivery's life.
var States = []State{StateQueued, StateForwarding, StateDelivered, StateFailed, StateRejected, StateParked, StateQuarantined, StateExpired}

// Source says how a result reached the plugin (Record.Source: callback or
// poll) and how a forward reaches the app (the X-Pingback-Source header:
// callback, replay or poll); an attempt's Source in the history also
// tells manual and bulk replays apart (see [SourceManual] and [SourceBulk]).
type Source string

// The sources.
const (
	// SourceCallback: the provider's pingback, live.
	SourceCallback Source = "callback"
	// SourceReplay: a redelivery of a stored result (retry, recovery after
	// a crash or reload, or a replay by hand).
	SourceReplay Source = "replay"
	// SourcePoll: a result the fallback poller fetched from res.php, on its
	// first delivery.
	SourcePoll Source = "poll"
	// SourceCorrection: the provider's own answer for a result whose
	// earlier delivery carried another code (a conflict the provider
	// settled); sent with the idempotency key "<provider>:<id>:correction".
	SourceCorrection Source = "correction"
)

// How a result was verified before delivery (Record.Verified, the
// X-Pingback-Verified header).
const (
	// VerifiedToken: the pingback carried its task's token.
	VerifiedToken = "token"
	// VerifiedResPHP: the code was read from, or confirmed by, the
	// provider's result API (res.php or getTaskResult).
	VerifiedResPHP = "res_php"
	// VerifiedNone: nothing verified it (verify none, an untracked task
	// without an api_key, or a quarantined result released by hand).
	VerifiedNone = "none"
)

// Request is the original HTTP request as the provider sent it, kept so that
// a replay can rebuild it byte for byte.
type Request struct {
	Method     string `json:"method"`
	URI        string `json:"uri"` // RequestURI: path and query as received
	Host       string `json:"host"`
	Proto      string `json:"proto,omitempty"`
	RemoteAddr string `json:"remote_addr,omitempty"`
	// LocalAddr is the server address the request came in on; its port
	// identifies the server a replay goes through.
	LocalAddr string      `json:"local_addr,omitempty"`
	TLS       bool        `json:"tls,omitempty"`
	Header    http.Header `json:"header,omitempty"`
	Body      []byte      `json:"body,omitempty"`
}

// Lease is the ownership of a record's forward in flight.
type Lease struct {
	// Owner names the store handle that holds the lease (Store.Owner);
	// the store fills it in.
	Owner string `json:"owner"`
	// Until is when the lease lapses unless renewed.
	Until time.Time `json:"until"`
}

// Record is one result (a solved task or a task-final error code) and its
// delivery state. Times are UTC wall-clock times.
type Record struct {
	Provider string `json:"provider"`
	ID       string `json:"id"`
	// Code is the result as the provider sent it; it may be an error
	// string such as ERROR_CAPTCHA_UNSOLVABLE. For a JSON API result it is
	// the canonical JSON of the answer's solution (or its errorCode).
	// Never log it.
	Code string `json:"code"`
	// Answer is the provider's whole answer for this result, byte for
	// byte, when it came as JSON (a res.php json=1 answer, a getTaskResult
	// answer, a JSON callback's body); nil otherwise. Local res.php and
	// getTaskResult answers reproduce it. Never log it.
	Answer []byte `json:"answer,omitempty"`
	// Source is how the result arrived: SourceCallback or SourcePoll.
	Source     Source    `json:"source"`
	ReceivedAt time.Time `json:"received_at"`
	// SubmittedAt is when the task was submitted, if it was tracked (set
	// from InsertResult.SubmittedAt when read back).
	SubmittedAt time.Time `json:"submitted_at,omitzero"`
	// Server is the name of the http app's server that received the
	// request; replays are dispatched through it.
	Server  string  `json:"server,omitempty"`
	Request Request `json:"request"`

	Delivery

	// ExpiresAt is when the store forgets the record (retention).
	ExpiresAt time.Time `json:"expires_at"`

	// Verified is how the result was verified (VerifiedToken,
	// VerifiedResPHP, VerifiedNone), sent as X-Pingback-Verified; empty
	// for records stored before verification existed (delivered as none).
	Verified string `json:"verified,omitempty"`
	// Tracked reports that the result's task was submitted through
	// pingback_track (or registered), sent as X-Pingback-Tracked. Insert
	// sets it when the insert completes a tracked task (InsertResult.
	// SubmittedAt set).
	Tracked bool `json:"tracked,omitempty"`
	// Quarantine says why a record is (or was) quarantined:
	// "token_mismatch", "unknown_id", "before_submission",
	// "not_confirmed", "provider_mismatch", "confirming"; empty for a
	// record never quarantined.
	Quarantine string `json:"quarantine,omitempty"`
	// OtherCode is the conflicting code of the same task that lost to
	// Code (a forgery, or the wrong code the provider's answer
	// corrected): both codes are kept. Never log it.
	OtherCode string `json:"other_code,omitempty"`
	// Correction reports that Code replaced a code the app had already
	// been sent: its deliveries carry X-Pingback-Source: correction and
	// the idempotency key "<provider>:<id>:correction".
	Correction bool `json:"correction,omitempty"`
	// PayloadErased reports that the payload (code, answer, other code,
	// request body, headers and query) was erased keep_payload after the
	// result was delivered (see PayloadEraser): the record only dedupes
	// and accounts for the result from then on.
	PayloadErased bool `json:"payload_erased,omitempty"`

	// Held reports, in an admin answer, that the record is queued or
	// failed while its provider is paused (see Pauser): computed when the
	// record is shown, never stored.
	Held bool `json:"held,omitempty"`
}

// Key returns the record's deduplication key.
func (r *Record) Key() Key { return Key{Provider: r.Provider, ID: r.ID} }

// Delivery is the part of a record that changes as its delivery goes on;
// the rest of a record never changes once stored.
type Delivery struct {
	State State `json:"state"`
	// Attempts counts forwards started, the first live one included: what
	// X-Pingback-Attempt carries.
	Attempts int `json:"attempts"`
	// Failures counts attempts that ended in a retryable failure or a
	// timeout; max_attempts bounds it.
	Failures int `json:"failures"`
	// Interrupts counts the forwards in a row whose lease lapsed before
	// they ended (cut by a crash); an attempt that ends resets it. A
	// forward cut by a reload or a stop does not count.
	Interrupts int `json:"interrupts,omitempty"`
	// DueAt is when a queued or failed record is forwarded next; zero in
	// the other states.
	DueAt time.Time `json:"due_at,omitzero"`
	// Lease is set while State is StateForwarding, and only then.
	Lease Lease `json:"lease,omitzero"`
	// LastStatus is the app's HTTP status of the last attempt that ended,
	// 0 when the app gave none (refused, timed out, interrupted).
	LastStatus int `json:"last_status,omitempty"`
	// LastError says what happened to the last attempt, if it was not a
	// delivery.
	LastError string    `json:"last_error,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
	// History lists the forwards started (Attempts counts them): the
	// first and the latest, at most MaxHistory (see StartAttempt); empty
	// for a result stored before the store kept it.
	History []Attempt `json:"history"`
	// ExpiredReason says why a record is in StateExpired: "max_age" (it
	// was older than its provider's max_age when it was due); empty in
	// every other state.
	ExpiredReason string `json:"expired_reason,omitempty"`
}

// Filter selects records for List. Empty fields match everything.
type Filter struct {
	Provider string
	State    State
}

// InsertResult is what Insert learned.
type InsertResult struct {
	// Existing is the record already stored under the key (the insert was
	// a duplicate and wrote nothing), or nil if the record was stored.
	Existing *Record
	// SubmittedAt is the submission time of the tracked task the insert
	// marked done, zero if the result's task was not tracked.
	SubmittedAt time.Time
	// Purged is set with Existing when the key's record was purged (see
	// Purger): Existing then holds only the key and the new record's code,
	// so that a caller that reads Existing alone answers a duplicate.
	Purged bool
}

// ClaimRequest asks Claim for records to forward.
type ClaimRequest struct {
	// Now is the time the claim is made at: queued and failed records are
	// due when DueAt is at or before it, and the lease runs from it. A
	// shared store may measure leases by its own clock instead.
	Now time.Time
	// Limit is the most records to claim (at least 1).
	Limit int
	// Keys, if set, claims these records whatever their state or due time
	// (a replay by hand), except those whose lease still holds.
	Keys []Key
	// Lease is how long the lease of a claimed record lasts.
	Lease time.Duration
	// Decide sees each claimable record's delivery state and changes it:
	// to StateForwarding to claim it (the store then sets the lease), or
	// to another state (parked, say) to leave it unclaimed. lapsed reports
	// a record whose lease lapsed (its forward was cut); the store has then
	// already set LastStatus to 0 and LastError to the reason.
	//
	// Decide runs inside the store's transaction and may run more than
	// once if the transaction is retried: it must be pure (no side effects
	// beyond d).
	Decide func(d *Delivery, lapsed bool)
	// DecideRecord, if set, is used instead of Decide and also sees the
	// claimable record as stored (read-only; its Delivery is not d), so
	// that the policy can depend on the record's other fields: the
	// replay loop names an attempt's source from the record's Source and
	// Correction. The same rules as for Decide apply.
	DecideRecord func(rec *Record, d *Delivery, lapsed bool)

	// Reserved, if positive, is how many of Limit go first to due records
	// (queued or failed) with at most FewFailures failures, the earliest
	// due first: fair claims, so that a backlog of records that failed
	// many times cannot starve a result that failed once or twice. Lapsed
	// leases are claimed before either (their forward was cut); the slots
	// that neither takes are filled by due time among all due records.
	// Ignored with Keys.
	Reserved int
	// Route, if set with Room, names the route of a claimable record (the
	// replay loop's host and path). Room maps a route to how many of its
	// records this claim may take at most: a route absent from Room is not
	// limited, 0 takes none. A record whose route has no room left is
	// skipped: left as it is, not shown to Decide, not returned. Skipping
	// is bounded: a claim examines at most Limit+ClaimSkipBudget
	// candidates in each of its passes, so records of limited routes
	// ahead of the others cost a bounded scan, not a full one. Route runs
	// inside the transaction like Decide and must be pure. Ignored with
	// Keys.
	Route func(rec *Record) string
	Room  map[string]int

	// SkipProviders names providers whose records this claim leaves
	// alone (paused: see Pauser): not shown to Decide, not returned, and
	// not counted against ClaimSkipBudget, so that any number of them
	// ahead of the others costs no claim of another provider's record.
	// Ignored with Keys.
	SkipProviders []string
}

// FewFailures is the most failures a due record may have to be claimed in
// the slots ClaimRequest.Reserved keeps for it.
const FewFailures = 2

// ClaimSkipBudget bounds how many candidates of routes without room a
// claim skips in each of its passes (lapsed leases, fair, by due time).
const ClaimSkipBudget = 256

// Valid reports whether req can be claimed: a positive limit and a
// decide function.
func (req *ClaimRequest) Valid() bool {
	return req.Limit >= 1 && (req.Decide != nil || req.DecideRecord != nil)
}

// Apply applies req's decide function to d, the delivery of rec.
func (req *ClaimRequest) Apply(rec *Record, d *Delivery, lapsed bool) {
	if req.DecideRecord != nil {
		req.DecideRecord(rec, d, lapsed)
		return
	}
	req.Decide(d, lapsed)
}

// Reasons a lease lapsed, as Delivery.LastError of the claim that took
// the record over.
const (
	LapseRestart = "interrupted by restart"
	LapseExpired = "interrupted: lease expired before the forward reported"
)

// Expired is a result whose retention ended before it was delivered.
type Expired struct {
	Key   Key
	State State
}

// Store is the durable store. Implementations must be safe for concurrent
// use. Functions passed to it (Decide, update functions) run inside its
// transactions and may run more than once when a transaction is retried, so
// they must be pure.
type Store interface {
	// Owner names this store handle as a lease owner: unique among every
	// handle that ever opened the same data.
	Owner() string

	// Insert durably stores rec unless a record with the same key exists.
	// If rec is in StateForwarding, the stored copy's lease is Owner()'s
	// (the caller sets Lease.Until), written in the insert's own
	// transaction. A pending task under the same key is marked done in the
	// same transaction, unless rec is quarantined or was received before
	// the task was submitted (a result older than its task never
	// completes it). Insert does not change rec, and does not use it
	// after it returns (the caller may reuse its header map).
	//
	// It returns once the commit is durable; Existing is set for a
	// duplicate (nothing written). On error nothing can be assumed stored:
	// ErrTooLarge for a record over MaxRecordSize, ErrUnavailable when the
	// store refuses writes (no space), others from the commit. A commit
	// under way is not abandoned when ctx ends; ctx's deadline bounds a
	// retry after a transient fault (PostgreSQL: see the package doc).
	Insert(ctx context.Context, rec *Record) (InsertResult, error)

	// Get returns the record under key, or ErrNotFound.
	Get(ctx context.Context, key Key) (*Record, error)

	// UpdateRecord atomically applies fn to the whole record under key
	// (its result, request and delivery state; not its key) and durably
	// stores the result, keeping the indexes in step, like UpdateDelivery.
	// When the record leaves StateQuarantined, the pending task under the
	// key is marked done in the same transaction, unless the record was
	// received before the task was submitted. If fn returns an error
	// nothing is written and that error is returned with the unchanged
	// record. Returns ErrNotFound if there is no such record.
	UpdateRecord(ctx context.Context, key Key, fn func(*Record) error) (*Record, error)

	// UpdateDelivery atomically applies fn to the delivery state of the
	// record under key and durably stores the result, keeping the indexes
	// in step; the stored request is neither read nor rewritten. If fn
	// returns an error nothing is written and that error is returned with
	// the unchanged state. A Lease whose Owner fn leaves empty while the
	// state is StateForwarding is given to this handle. Returns
	// ErrNotFound if there is no such record.
	UpdateDelivery(ctx context.Context, key Key, fn func(*Delivery) error) (Delivery, error)

	// Claim leases up to req.Limit records to this handle in one atomic
	// operation: queued and failed records that are due, and forwarding
	// records whose lease lapsed, earliest first (or req.Keys). It returns
	// every record Decide saw, with its new delivery state; those in
	// StateForwarding are the caller's to forward.
	Claim(ctx context.Context, req ClaimRequest) ([]*Record, error)

	// Renew extends the lease of the record's forward number attempt to
	// until, or fails with ErrLeaseLost if this handle no longer holds it.
	Renew(ctx context.Context, key Key, attempt int, until time.Time) error

	// LeaseTerm is how long a lease may last before it must be renewed; 0
	// means leases are never renewed: the holder sets Until beyond its
	// longest forward, and the lease lapses at Until or with its owner.
	LeaseTerm() time.Duration

	// Expire forgets the results whose retention ended at or before now
	// and reports those among them that were never delivered, up to
	// limit of them; a call that reports limit may have left more. On an
	// error, the results it returns were forgotten all the same.
	Expire(ctx context.Context, now time.Time, limit int) ([]Expired, error)

	// List returns up to limit records matching the filter, ordered by
	// provider and id. It scans the stored records: meant for operators,
	// not for hot paths.
	List(ctx context.Context, f Filter, limit int) ([]*Record, error)

	// Available reports whether the store currently accepts writes.
	Available() bool

	// Close waits for pending writes and releases the store. It is safe
	// to call more than once; later operations return ErrClosed.
	Close() error

	TaskStore
	Counter
	Lister
	Purger
	PayloadEraser
	Pauser
}
