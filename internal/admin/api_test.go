package admin

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// FuzzPathSegments checks the admin API's path splitting: any two
// segments (provider and id, whatever bytes they hold, slashes included),
// escaped as a client escapes them, come back exactly; and no input
// panics.
func FuzzPathSegments(f *testing.F) {
	f.Add("2captcha", "77/replay", "/pingback/records/x%2Fy/z")
	f.Add("capsolver", "a%2Fb", "/pingback/records/%zz")
	f.Add("", "\xff", "/pingback/records//")
	f.Fuzz(func(t *testing.T, provider, id, raw string) {
		target := "/pingback/records/" + url.PathEscape(provider) + "/" + url.PathEscape(id)
		r := httptest.NewRequest("GET", "http://localhost"+target, nil)
		if got := pathSegments(r, "/pingback/records/"); !slices.Equal(got, []string{provider, id}) {
			t.Fatalf("pathSegments(%q) = %q, want [%q %q]", target, got, provider, id)
		}
		if !strings.HasPrefix(raw, "/") {
			return
		}
		if u, err := url.ParseRequestURI(raw); err == nil {
			r.URL = u
			_ = pathSegments(r, "/pingback/records/")
		}
	})
}

// TestStartingWindow: while an app is starting and no running app has an
// open store, every route answers 503 "starting: the store is opening";
// a running app that is ready answers even then (a reload); after the
// start, the routes answer for themselves again.
func TestStartingWindow(t *testing.T) {
	state := NewState()
	state.BeginStart()
	for _, tc := range []struct {
		name    string
		backend Backend
		want    int
		wantErr string
	}{
		{"first start", nil, http.StatusServiceUnavailable, "starting: the store is opening"},
		{"running app not ready", &fakeBackend{st: &fakeStore{}}, http.StatusServiceUnavailable, "starting: the store is opening"},
		{"reload: the running app answers", &fakeBackend{ready: true, storeErr: errors.New("store not open")}, http.StatusServiceUnavailable, "store not open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := newTestAPI(tc.backend, state)
			for _, rt := range api.Routes() {
				target := rt.Pattern
				if strings.HasSuffix(target, "/") {
					target += "captchaai/1"
				}
				method := http.MethodGet
				if rt.Pattern == "/pingback/replays" || rt.Pattern == "/pingback/purges" {
					method = http.MethodPost
				}
				code, msg := serve(t, api, method, target, `{"state":"failed"}`)
				if tc.name != "reload: the running app answers" && (code != tc.want || msg != tc.wantErr) {
					t.Errorf("%s %s: %d %q, want %d %q", method, target, code, msg, tc.want, tc.wantErr)
				}
				if tc.name == "reload: the running app answers" && msg == "starting: the store is opening" {
					t.Errorf("%s %s answered starting during a reload", method, target)
				}
			}
		})
	}
	state.EndStart()
	if code, msg := serve(t, newTestAPI(nil, state), http.MethodGet, "/pingback/status", ""); code != http.StatusServiceUnavailable || !strings.HasPrefix(msg, "pingback app not running") {
		t.Errorf("after the start, no app: %d %q, want 503 pingback app not running", code, msg)
	}
	if code, msg := serve(t, newTestAPI(nil, nil), http.MethodGet, "/pingback/status", ""); code != http.StatusServiceUnavailable || !strings.HasPrefix(msg, "pingback app not running") {
		t.Errorf("no state at all: %d %q, want 503 pingback app not running", code, msg)
	}
}

// TestRecordErrors checks how one result's routes map the backend's and
// the store's errors to statuses and messages.
func TestRecordErrors(t *testing.T) {
	key := store.Key{Provider: "2captcha", ID: "77"}
	for _, tc := range []struct {
		name, method, target string
		replayErr, storeErr  error
		want                 int
		wantMsg              string
	}{
		{"replay in flight", http.MethodPost, "/pingback/records/2captcha/77/replay", Conflict{errors.New("a forward of this result is in flight")}, nil,
			http.StatusConflict, "2captcha:77: a forward of this result is in flight"},
		{"replay of a purged one", http.MethodPost, "/pingback/records/2captcha/77/replay", store.ErrPurged, nil,
			http.StatusNotFound, "2captcha:77 was purged: it cannot be replayed"},
		{"replay of an unknown one", http.MethodPost, "/pingback/records/2captcha/78/replay", fmt.Errorf("get: %w", store.ErrNotFound), nil,
			http.StatusNotFound, "no stored result 2captcha:78"},
		{"replay, store away", http.MethodPost, "/pingback/records/2captcha/77/replay", Unavailable{errors.New("store not open")}, nil,
			http.StatusServiceUnavailable, "store not open"},
		{"replay, store closed", http.MethodPost, "/pingback/records/2captcha/77/replay", store.ErrClosed, nil,
			http.StatusServiceUnavailable, store.ErrClosed.Error()},
		{"replay, other error", http.MethodPost, "/pingback/records/2captcha/77/replay", errors.New("disk on fire"), nil,
			http.StatusInternalServerError, "disk on fire"},
		{"release of one not quarantined", http.MethodPost, "/pingback/records/2captcha/77/release", Conflict{errors.New("result is not quarantined")}, nil,
			http.StatusConflict, "2captcha:77: result is not quarantined"},
		{"bad force", http.MethodPost, "/pingback/records/2captcha/77/replay?force=maybe", nil, nil,
			http.StatusBadRequest, `force must be true or false, got "maybe"`},
		{"replay by GET", http.MethodGet, "/pingback/records/2captcha/77/replay", nil, nil,
			http.StatusMethodNotAllowed, "method GET not allowed: use POST"},
		{"unknown action", http.MethodPost, "/pingback/records/2captcha/77/redo", nil, nil,
			http.StatusNotFound, "not found: use GET /pingback/records/<provider>/<id> or POST /pingback/records/<provider>/<id>/replay (or /release)"},
		{"get, store not open", http.MethodGet, "/pingback/records/2captcha/77", nil, errors.New("store not open"),
			http.StatusServiceUnavailable, "store not open"},
		{"get of an unknown one", http.MethodGet, "/pingback/records/2captcha/0078", nil, nil,
			http.StatusNotFound, "no stored result 2captcha:78"}, // the canonical id
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{ready: true, replayErr: tc.replayErr, storeErr: tc.storeErr,
				st: &fakeStore{records: map[store.Key]*store.Record{key: {Provider: "2captcha", ID: "77"}}}}
			code, msg := serve(t, newTestAPI(b, NewState()), tc.method, tc.target, "")
			if code != tc.want || msg != tc.wantMsg {
				t.Errorf("%s %s: %d %q, want %d %q", tc.method, tc.target, code, msg, tc.want, tc.wantMsg)
			}
		})
	}
}

// TestListRecordsCursorAndLimit: a page's next_cursor, given back, asks
// the store for the page after its position; bad limits and cursors are
// refused before the store is asked.
func TestListRecordsCursorAndLimit(t *testing.T) {
	at := time.Date(2026, 11, 30, 8, 0, 0, 123, time.UTC)
	next := store.Position{ReceivedAt: at, Key: store.Key{Provider: "capsolver", ID: "a/b"}}
	st := &fakeStore{page: store.Page{Next: &next}}
	api := newTestAPI(&fakeBackend{ready: true, st: st}, NewState())
	code, body := serve(t, api, http.MethodGet, "/pingback/records?state=parked&limit=2", "")
	if code != http.StatusOK || !strings.Contains(body, `"records":[]`) {
		t.Fatalf("first page: %d %s, want 200 with an empty list", code, body)
	}
	cur := body[strings.Index(body, `"next_cursor":"`)+len(`"next_cursor":"`):]
	cur = cur[:strings.Index(cur, `"`)]
	if code, body := serve(t, api, http.MethodGet, "/pingback/records?state=parked&limit=2&cursor="+cur, ""); code != http.StatusOK {
		t.Fatalf("second page: %d %s", code, body)
	}
	if len(st.listed) != 2 || st.listed[1].After == nil || *st.listed[1].After != next || st.listed[1].Limit != 2 || st.listed[1].State != store.StateParked {
		t.Fatalf("the store got %+v, want the second query after %+v with limit 2", st.listed, next)
	}
	for _, q := range []string{"limit=0", "limit=10001", "limit=ten", "cursor=nope", "cursor=" + encodeCursor(time.Time{}, store.Key{Provider: "x"}),
		"state=lost", "provider=deathbycaptcha", "received_after=yesterday"} {
		if code, msg := serve(t, api, http.MethodGet, "/pingback/records?"+q, ""); code != http.StatusBadRequest {
			t.Errorf("?%s: %d %q, want 400", q, code, msg)
		}
	}
	if len(st.listed) != 2 {
		t.Errorf("the store was asked %d times, want only for the two good pages", len(st.listed))
	}
}

// TestCursorRoundTrip: a cursor decodes to the position it encodes
// (a zero time too); what this API did not give is refused.
func TestCursorRoundTrip(t *testing.T) {
	for _, at := range []time.Time{{}, time.Unix(0, 1).UTC(), time.Date(2026, 12, 1, 0, 0, 0, 999, time.UTC)} {
		k := store.Key{Provider: "2captcha", ID: "1/2"}
		gotAt, gotK, err := decodeCursor(encodeCursor(at, k))
		if err != nil || !gotAt.Equal(at) || gotK != k {
			t.Errorf("round trip of %v %v: %v %v %v", at, k, gotAt, gotK, err)
		}
	}
	for _, bad := range []string{"", "!!", "W10", // []
		"WyIyY2FwdGNoYSIsIjEiXQ", // ["2captcha","1"]: the order before
		encodeCursor(time.Time{}, store.Key{ID: "1"})} {
		if _, _, err := decodeCursor(bad); !errors.Is(err, errBadCursor) {
			t.Errorf("decodeCursor(%q) = %v, want errBadCursor", bad, err)
		}
	}
}

// TestRegisterTaskInput: registrations are checked before the app is
// asked; the answer shows the task without its token.
func TestRegisterTaskInput(t *testing.T) {
	b := &fakeBackend{ready: true, st: &fakeStore{}}
	api := newTestAPI(b, NewState())
	for _, tc := range []struct{ body, want string }{
		{`{"id":"1","pingback_url":"http://x/cb"}`, "provider is required"},
		{`{"provider":"captchaai","pingback_url":"http://x/cb"}`, "id is required"},
		{`{"provider":"captchaai","id":"1"}`, "pingback_url is required"},
		{`{"provider":"captchaai","id":"1","pingback_url":"http://x/cb","api":"soap"}`, `api must be legacy or json, got "soap"`},
		{`{"provider":"captchaai","id":"1","pingback_url":"http://x/cb","submitted_at":"2026-12-01T12:00:01Z"}`, "submitted_at 2026-12-01T12:00:01Z is in the future (now 2026-12-01T12:00:00Z)"},
		{`{"provider":"captchaai","id":"1","pingback_url":"http://x/cb","submitted_at":"2026-12-01T10:59:59Z"}`, "submitted_at 2026-12-01T10:59:59Z is older than give_up (1h0m0s): the task would be expired at once"},
		{`{"provider":"captchaai","id":"1","pingback_url":"http://x/cb","colour":"red"}`, `decoding JSON body: json: unknown field "colour"`},
	} {
		if code, msg := serve(t, api, http.MethodPost, "/pingback/tasks", tc.body); code != http.StatusBadRequest || msg != tc.want {
			t.Errorf("POST %s: %d %q, want 400 %q", tc.body, code, msg, tc.want)
		}
	}
	if len(b.registered) != 0 {
		t.Fatalf("the app got %d bad registrations", len(b.registered))
	}
	code, body := serve(t, api, http.MethodPost, "/pingback/tasks", `{"provider":"captchaai","id":"1","pingback_url":"http://x/cb"}`)
	if code != http.StatusCreated || strings.Contains(body, "secret") {
		t.Errorf("a good registration: %d %s, want 201 without the token", code, body)
	}
	if code, msg := serve(t, api, http.MethodGet, "/pingback/tasks?account=ABC", ""); code != http.StatusBadRequest || !strings.Contains(msg, "account must be an account id of 16 hex characters") {
		t.Errorf("a bad account: %d %q", code, msg)
	}
}
