package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// pagedStore is a store.Store whose ListPage pages through its records
// (in received-time order, then key) as the drivers do; the other methods
// panic if called.
type pagedStore struct {
	store.Store
	records []*store.Record
	pages   int // ListPage calls
}

func (s *pagedStore) ListPage(_ context.Context, q store.ListQuery) (store.Page, error) {
	s.pages++
	var out store.Page
	for _, r := range s.records {
		pos := store.Position{ReceivedAt: r.ReceivedAt, Key: r.Key()}
		if q.State != "" && r.State != q.State || q.After != nil && !positionAfter(pos, *q.After) {
			continue
		}
		if len(out.Records) == q.Limit {
			last := out.Records[len(out.Records)-1]
			out.Next = &store.Position{ReceivedAt: last.ReceivedAt, Key: last.Key()}
			break
		}
		out.Records = append(out.Records, r)
	}
	return out, nil
}

func positionAfter(a, b store.Position) bool {
	return a.ReceivedAt.After(b.ReceivedAt) || a.ReceivedAt.Equal(b.ReceivedAt) && (a.Key.Provider+"\x00"+a.Key.ID) > (b.Key.Provider+"\x00"+b.Key.ID)
}

// deadLetter is a record of provider in state, forwarded to uri on host,
// whose last attempt failed with lastErr at failedAt (an attempt history
// when failedAt is set, else only its update time, updated).
func deadLetter(n int, provider string, state store.State, host, uri, lastErr string, failedAt, updated time.Time) *store.Record {
	r := &store.Record{Provider: provider, ID: fmt.Sprint(n), ReceivedAt: time.Date(2026, 12, 1, 10, 0, n, 0, time.UTC),
		Request: store.Request{Host: host, URI: uri}}
	r.State, r.LastError, r.UpdatedAt = state, lastErr, updated
	if !failedAt.IsZero() {
		r.History = []store.Attempt{
			{Attempt: 1, StartedAt: failedAt.Add(-time.Minute), EndedAt: failedAt.Add(-time.Minute + time.Second), Outcome: store.OutcomeFailed, Error: "earlier"},
			{Attempt: 2, StartedAt: failedAt.Add(-time.Second), EndedAt: failedAt, Outcome: store.OutcomeFailed, Error: lastErr},
		}
	}
	return r
}

// TestDeadLetterGroups: GET /pingback/deadletters groups the parked,
// rejected and failed results by route (host and path, never the query),
// provider, state and last error, with their count and first and last
// failure times; delivered, queued and quarantined results are not dead
// letters; the most recently seen group comes first.
func TestDeadLetterGroups(t *testing.T) {
	at := func(m int) time.Time { return time.Date(2026, 12, 1, 11, m, 0, 0, time.UTC) }
	refused := "dial tcp 127.0.0.1:9: connection refused"
	st := &pagedStore{records: []*store.Record{
		deadLetter(1, "2captcha", store.StateParked, "app.example", "/cb?code=SECRET", refused, at(5), at(50)),
		deadLetter(2, "2captcha", store.StateParked, "app.example", "/cb", refused, at(1), at(51)),
		deadLetter(3, "2captcha", store.StateParked, "app.example", "/cb?x=1", refused, at(9), at(52)),
		deadLetter(4, "2captcha", store.StateParked, "app.example", "/cb", "app answered 500", at(7), at(53)),
		deadLetter(5, "2captcha", store.StateRejected, "app.example", "/cb", "app answered 400", at(3), at(54)),
		deadLetter(6, "capsolver", store.StateFailed, "app.example", "/json", refused, time.Time{}, at(20)),
		deadLetter(7, "2captcha", store.StateParked, "other.example", "/cb", refused, at(2), at(55)),
		deadLetter(8, "2captcha", store.StateDelivered, "app.example", "/cb", "", at(4), at(56)),
		deadLetter(9, "2captcha", store.StateQuarantined, "app.example", "/cb", "", time.Time{}, at(57)),
		deadLetter(10, "2captcha", store.StateQueued, "app.example", "/cb", refused, at(4), at(58)),
	}}
	api := newTestAPI(&fakeBackend{ready: true, st: &fakeStore{}}, NewState())
	api.lookup = func() (Backend, error) { return &pagedBackend{fakeBackend{ready: true}, st}, nil }
	status, body := serve(t, api, http.MethodGet, "/pingback/deadletters", "")
	if status != http.StatusOK {
		t.Fatalf("GET /pingback/deadletters: %d %s", status, body)
	}
	var ans adminapi.DeadLetters
	if err := json.Unmarshal([]byte(body), &ans); err != nil {
		t.Fatal(err)
	}
	want := []adminapi.DeadLetterGroup{
		{Route: "app.example/json", Provider: "capsolver", State: store.StateFailed, Error: refused, Count: 1, FirstSeen: at(20), LastSeen: at(20)},
		{Route: "app.example/cb", Provider: "2captcha", State: store.StateParked, Error: refused, Count: 3, FirstSeen: at(1), LastSeen: at(9)},
		{Route: "app.example/cb", Provider: "2captcha", State: store.StateParked, Error: "app answered 500", Count: 1, FirstSeen: at(7), LastSeen: at(7)},
		{Route: "app.example/cb", Provider: "2captcha", State: store.StateRejected, Error: "app answered 400", Count: 1, FirstSeen: at(3), LastSeen: at(3)},
		{Route: "other.example/cb", Provider: "2captcha", State: store.StateParked, Error: refused, Count: 1, FirstSeen: at(2), LastSeen: at(2)},
	}
	if !slices.EqualFunc(ans.Groups, want, func(a, b adminapi.DeadLetterGroup) bool {
		return a.Route == b.Route && a.Provider == b.Provider && a.State == b.State && a.Error == b.Error && a.Count == b.Count &&
			a.FirstSeen.Equal(b.FirstSeen) && a.LastSeen.Equal(b.LastSeen)
	}) {
		t.Errorf("groups:\n%+v\nwant\n%+v", ans.Groups, want)
	}
	if ans.Scanned != 7 || ans.Truncated {
		t.Errorf("scanned %d, truncated %v; want 7 records read, not truncated", ans.Scanned, ans.Truncated)
	}
}

// TestDeadLetterScanIsBounded: the scan reads the store by pages and
// stops at its bound, saying so; with nothing to group it answers an
// empty list (never null).
func TestDeadLetterScanIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name              string
		n, limit          int
		wantScanned       int
		wantTruncated     bool
		wantCount, groups int
	}{
		{"none", 0, 10, 0, false, 0, 0},
		{"under the bound", 7, 10, 7, false, 7, 1},
		{"at the bound", 10, 10, 10, true, 10, 1},
		{"over the bound", 1200, 1000, 1000, true, 1000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &pagedStore{}
			for i := range tc.n {
				st.records = append(st.records, deadLetter(i, "2captcha", store.StateParked, "app.example", "/cb", "refused", time.Time{}, time.Unix(int64(i), 0)))
			}
			ans, err := groupDeadLetters(context.Background(), st, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if ans.Scanned != tc.wantScanned || ans.Truncated != tc.wantTruncated || len(ans.Groups) != tc.groups || ans.Groups == nil {
				t.Fatalf("scanned %d, truncated %v, %d groups (%v); want %d, %v, %d", ans.Scanned, ans.Truncated, len(ans.Groups), ans.Groups == nil,
					tc.wantScanned, tc.wantTruncated, tc.groups)
			}
			if tc.groups > 0 && ans.Groups[0].Count != tc.wantCount {
				t.Errorf("count %d, want %d", ans.Groups[0].Count, tc.wantCount)
			}
			if tc.n > deadLetterPage && st.pages < 2 {
				t.Errorf("%d records read in %d ListPage calls: want pages", ans.Scanned, st.pages)
			}
		})
	}
}

// TestDeadLettersRefusals: only GET; 503 while the store is away.
func TestDeadLettersRefusals(t *testing.T) {
	api := newTestAPI(&fakeBackend{ready: true, st: &fakeStore{}}, NewState())
	if status, _ := serve(t, api, http.MethodPost, "/pingback/deadletters", ""); status != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", status)
	}
	away := newTestAPI(&fakeBackend{ready: true, storeErr: store.ErrUnavailable}, NewState())
	if status, _ := serve(t, away, http.MethodGet, "/pingback/deadletters", ""); status != http.StatusServiceUnavailable {
		t.Errorf("store away: %d, want 503", status)
	}
}

// pagedBackend is a fakeBackend over a pagedStore.
type pagedBackend struct {
	fakeBackend
	st *pagedStore
}

func (b *pagedBackend) Store() (store.Store, error) { return b.st, nil }
