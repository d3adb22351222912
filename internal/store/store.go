// Package store defines the durable storage behind the pingback plugin and
// its single-node implementation on Badger.
//
// The Store interface is deliberately small so that a distributed backend
// (see ../shared/reference/badger-and-distributed-stores.md §5) can implement
// the same contract: a write returns success only after it is durably
// committed, deduplication is atomic with the write of the record, and the
// due index (what the replay loop scans) is updated in the same transaction
// as the record it points to.
package store

import (
	"bytes"
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
	// ErrSkip may be returned by an Update function to leave the record
	// unchanged; Update then returns the current record and ErrSkip.
	ErrSkip = errors.New("update skipped")
)

// Key identifies a result: the provider's name and its task id. It is the
// deduplication key and, as "<provider>:<id>", the idempotency key the app sees.
type Key struct {
	Provider string
	ID       string
}

// String returns the idempotency key form "<provider>:<id>".
func (k Key) String() string { return k.Provider + ":" + k.ID }

// State is where a record stands in its delivery to the app.
type State string

// The states of a record. Only StateForwarding and StateFailed records carry
// a due time (DueAt); the others are final until the record expires.
const (
	// StateForwarding: stored, a forward to the app is (or was, before a
	// crash) in flight. If it is still forwarding at DueAt, the replay loop
	// takes it as stuck and replays it.
	StateForwarding State = "forwarding"
	// StateDelivered: the app answered 2xx or 3xx.
	StateDelivered State = "delivered"
	// StateFailed: the last forward failed in a retryable way (transport
	// error, 5xx, 408, 429); the replay loop retries it at DueAt.
	StateFailed State = "failed"
	// StateRejected: the app answered another 4xx; kept in the dead-letter
	// queue, never retried automatically.
	StateRejected State = "rejected"
	// StateParked: retryable failures exhausted max_attempts; kept and
	// visible, never retried automatically.
	StateParked State = "parked"
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

// Record is one result (a solved task or a task-final error code) and its
// delivery state. Times are UTC wall-clock times.
type Record struct {
	Provider string `json:"provider"`
	ID       string `json:"id"`
	// Code is the result as the provider sent it; it may be an error
	// string such as ERROR_CAPTCHA_UNSOLVABLE. Never log it.
	Code string `json:"code"`
	// Source is how the result arrived: "callback" or "poll".
	Source     string    `json:"source"`
	ReceivedAt time.Time `json:"received_at"`
	// SubmittedAt is when the task was submitted, if it was tracked; Insert
	// fills it in (and marks the task done) in the same transaction.
	SubmittedAt time.Time `json:"submitted_at,omitzero"`
	// Server is the name of the http app's server that received the
	// request; replays are dispatched through it.
	Server  string  `json:"server,omitempty"`
	Request Request `json:"request"`

	State State `json:"state"`
	// Attempts counts forwards started, the first live one included.
	Attempts int `json:"attempts"`
	// DueAt is when the replay loop should look at the record again
	// (retry, or recover a stuck forward); zero means never.
	DueAt      time.Time `json:"due_at,omitzero"`
	LastStatus int       `json:"last_status,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
	UpdatedAt  time.Time `json:"updated_at"`
	// ExpiresAt is when the store forgets the record (retention).
	ExpiresAt time.Time `json:"expires_at"`
}

// Key returns the record's deduplication key.
func (r *Record) Key() Key { return Key{Provider: r.Provider, ID: r.ID} }

// Delivery is the part of a record that changes as its delivery goes on;
// the rest of a record never changes once stored.
type Delivery struct {
	State      State     `json:"state"`
	Attempts   int       `json:"attempts"`
	DueAt      time.Time `json:"due_at,omitzero"`
	LastStatus int       `json:"last_status,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// Delivery returns the record's delivery state.
func (r *Record) Delivery() Delivery {
	return Delivery{State: r.State, Attempts: r.Attempts, DueAt: r.DueAt,
		LastStatus: r.LastStatus, LastError: r.LastError, UpdatedAt: r.UpdatedAt}
}

// SetDelivery sets the record's delivery state.
func (r *Record) SetDelivery(d Delivery) {
	r.State, r.Attempts, r.DueAt = d.State, d.Attempts, d.DueAt
	r.LastStatus, r.LastError, r.UpdatedAt = d.LastStatus, d.LastError, d.UpdatedAt
}

// clone returns a deep copy of r. Keep it in step with Record's fields: all
// but Request.Header and Request.Body are values.
func (r *Record) clone() *Record {
	c := *r
	c.Request.Header = r.Request.Header.Clone()
	c.Request.Body = bytes.Clone(r.Request.Body)
	return &c
}

// Filter selects records for List. Empty fields match everything.
type Filter struct {
	Provider string
	State    State
}

// Store is the durable store. Implementations must be safe for concurrent use.
type Store interface {
	// Insert durably stores rec unless a record with the same key exists.
	// A pending task under the same key is marked done in the same
	// transaction, and its submission time copied to rec.SubmittedAt.
	// It returns (nil, nil) once rec is committed, (existing, nil) if the
	// key was already stored (rec is not written), or (nil, err) if the
	// commit failed, in which case nothing can be assumed stored.
	Insert(ctx context.Context, rec *Record) (existing *Record, err error)

	// Get returns the record under key, or ErrNotFound.
	Get(ctx context.Context, key Key) (*Record, error)

	// Update atomically applies fn to the record under key and durably
	// stores the result, keeping the due index in step with DueAt. If fn
	// returns an error nothing is written and that error is returned
	// together with the unchanged record. Returns ErrNotFound if there is
	// no such record.
	Update(ctx context.Context, key Key, fn func(*Record) error) (*Record, error)

	// UpdateDelivery is Update for the delivery state alone: fn sees and
	// changes only the Delivery part, and the stored request is neither
	// read nor rewritten, which makes it the cheap path for recording
	// outcomes and claiming replays. Errors as for Update.
	UpdateDelivery(ctx context.Context, key Key, fn func(*Delivery) error) (Delivery, error)

	// Due returns up to limit records whose DueAt is at or before now,
	// earliest first.
	Due(ctx context.Context, now time.Time, limit int) ([]*Record, error)

	// List returns up to limit records matching the filter, ordered by
	// provider and id. It scans the stored records: meant for operators,
	// not for hot paths.
	List(ctx context.Context, f Filter, limit int) ([]*Record, error)

	// Close waits for pending writes and releases the store. It is safe
	// to call more than once; later operations return ErrClosed.
	Close() error

	TaskStore
}
