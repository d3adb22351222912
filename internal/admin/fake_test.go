package admin

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// fakeStore is a store.Store of which the admin routes' unit tests use
// only what they set: the methods left nil panic if called.
type fakeStore struct {
	store.Store
	mu       sync.Mutex
	records  map[store.Key]*store.Record
	listed   []store.ListQuery // the queries ListPage got
	page     store.Page        // what ListPage answers
	listErr  error
	purgeErr error
}

func (s *fakeStore) Get(_ context.Context, key store.Key) (*store.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.records[key]; ok {
		return r, nil
	}
	return nil, store.ErrNotFound
}

func (s *fakeStore) ListPage(_ context.Context, q store.ListQuery) (store.Page, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listed = append(s.listed, q)
	return s.page, s.listErr
}

func (s *fakeStore) List(_ context.Context, f store.Filter, _ int) ([]*store.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*store.Record
	for _, r := range s.records {
		if r.State == f.State && (f.Provider == "" || r.Provider == f.Provider) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *fakeStore) Purge(_ context.Context, q store.PurgeQuery) (int, error) {
	if s.purgeErr != nil {
		return 0, s.purgeErr
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, k := range q.Keys {
		if _, ok := s.records[k]; ok {
			delete(s.records, k)
			n++
		}
	}
	return n, nil
}

// fakeBackend is an admin.Backend whose answers the test sets.
type fakeBackend struct {
	ready      bool
	st         *fakeStore
	storeErr   error
	replayErr  error
	replayed   []store.Key
	jobCtx     context.Context
	hold       chan struct{} // ReplayInSlots waits for it (or ctx) before each key, when set
	logger     *zap.Logger
	registered []adminapi.TaskRegistration

	history      []store.HistoryMinute // the minute records History answers from
	historyAsked [][2]time.Time        // the ranges History was asked for
}

func (b *fakeBackend) Ready() bool { return b.ready }
func (b *fakeBackend) Store() (store.Store, error) {
	if b.storeErr != nil {
		return nil, b.storeErr
	}
	return b.st, nil
}
func (b *fakeBackend) Now() time.Time { return time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC) }
func (b *fakeBackend) Logger() *zap.Logger {
	if b.logger == nil {
		return zap.NewNop()
	}
	return b.logger
}
func (b *fakeBackend) GiveUp(string) time.Duration { return time.Hour }
func (b *fakeBackend) RegisterTask(_ context.Context, reg adminapi.TaskRegistration, at time.Time, api protocol.API) (*store.Task, bool, error) {
	b.registered = append(b.registered, reg)
	return &store.Task{Provider: reg.Provider, ID: reg.ID, Token: "secret"}, true, nil
}
func (b *fakeBackend) ReplayResult(_ context.Context, key store.Key, _ bool) (*store.Record, error) {
	b.replayed = append(b.replayed, key)
	if b.replayErr != nil {
		return nil, b.replayErr
	}
	return &store.Record{Provider: key.Provider, ID: key.ID}, nil
}
func (b *fakeBackend) ReleaseResult(ctx context.Context, key store.Key) (*store.Record, error) {
	return b.ReplayResult(ctx, key, false)
}
func (b *fakeBackend) PurgedResults(context.Context, store.Store, string) {}
func (b *fakeBackend) JobContext() context.Context {
	if b.jobCtx == nil {
		return context.Background()
	}
	return b.jobCtx
}

// ReplayInSlots replays each key once ctx allows: with hold set, a key
// whose hold was received is replayed even if ctx ends meanwhile (as an
// attempt already started ends), so a test that sends on hold and then
// cancels sees that one attempt counted whatever the scheduling.
func (b *fakeBackend) ReplayInSlots(ctx context.Context, keys []store.Key, done func(bool)) {
	for range keys {
		if b.hold != nil {
			select {
			case <-b.hold:
			case <-ctx.Done():
				return
			}
		} else if ctx.Err() != nil {
			return
		}
		done(true)
	}
}
func (b *fakeBackend) Status(context.Context) (adminapi.StatusAnswer, error) {
	return adminapi.StatusAnswer{}, caddy.APIError{HTTPStatus: http.StatusServiceUnavailable, Err: errors.New("reading the store's ages failed")}
}
func (b *fakeBackend) PublicRecord(r *store.Record) *store.Record { return r }
func (b *fakeBackend) PublicTask(t *store.Task) *store.Task {
	cp := *t
	cp.Token = ""
	return &cp
}

// newTestAPI returns routes answering for b (nil: no app running) with
// state (nil: none held).
func newTestAPI(b Backend, state *State) *API {
	return NewAPI(func() (Backend, error) {
		if b == nil {
			return nil, errors.New("pingback app not running: not configured")
		}
		return b, nil
	}, func() *State { return state })
}

// serve sends a request to the route of api whose pattern matches, as
// Caddy's admin endpoint would, and returns its status and the error or
// body it answered.
func serve(t *testing.T, api *API, method, target, body string) (int, string) {
	t.Helper()
	mux := http.NewServeMux()
	handlers := map[string]caddy.AdminHandler{}
	for _, rt := range api.Routes() {
		mux.Handle(rt.Pattern, http.NotFoundHandler())
		handlers[rt.Pattern] = rt.Handler
	}
	r := httptest.NewRequest(method, "http://localhost"+target, strings.NewReader(body))
	_, pattern := mux.Handler(r)
	h, ok := handlers[pattern]
	if !ok {
		t.Fatalf("no route for %s", target)
	}
	w := httptest.NewRecorder()
	if err := h.ServeHTTP(w, r); err != nil {
		var apiErr caddy.APIError
		if !errors.As(err, &apiErr) {
			return http.StatusInternalServerError, err.Error()
		}
		return apiErr.HTTPStatus, apiErr.Err.Error()
	}
	return w.Code, w.Body.String()
}
