package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// History answers the minute records the fake's history holds.
func (b *fakeBackend) History(_ context.Context, from, to time.Time) (adminapi.HistoryAnswer, error) {
	b.historyAsked = append(b.historyAsked, [2]time.Time{from, to})
	return adminapi.NewHistoryAnswer(from, to, b.history), nil
}

// HistorySpan is a day, the default retention.
func (b *fakeBackend) HistorySpan() time.Duration { return 24 * time.Hour }

// TestHistoryRange checks the range GET /pingback/history answers: the
// defaults (the last hour, up to the end of the current minute), times
// rounded out to whole minutes, and 400 with a reason for bad input.
func TestHistoryRange(t *testing.T) {
	tests := []struct {
		name, query    string
		status         int
		from, to, want string // want: a part of the 400's reason
	}{
		{name: "default", status: 200, from: "2026-12-01T11:01:00Z", to: "2026-12-01T12:01:00Z"}, // the fake's now is 12:00:00
		{name: "from only", query: "from=2026-12-01T10:00:00Z", status: 200, from: "2026-12-01T10:00:00Z", to: "2026-12-01T12:01:00Z"},
		{name: "rounded out", query: "from=2026-12-01T08:00:30Z&to=2026-12-01T09:00:01Z", status: 200, from: "2026-12-01T08:00:00Z", to: "2026-12-01T09:01:00Z"},
		{name: "offset", query: "from=2026-12-01T10:00:00%2B01:00&to=2026-12-01T10:00:00Z", status: 200, from: "2026-12-01T09:00:00Z", to: "2026-12-01T10:00:00Z"},
		{name: "a whole day", query: "from=2026-11-30T10:00:00Z&to=2026-12-01T10:00:00Z", status: 200, from: "2026-11-30T10:00:00Z", to: "2026-12-01T10:00:00Z"},
		{name: "malformed from", query: "from=yesterday", status: 400, want: "from must be an RFC 3339 time"},
		{name: "malformed to", query: "to=2026-12-01", status: 400, want: "to must be an RFC 3339 time"},
		{name: "from after to", query: "from=2026-12-01T10:00:00Z&to=2026-12-01T09:00:00Z", status: 400, want: "must be before to"},
		{name: "from equals to", query: "from=2026-12-01T10:00:00Z&to=2026-12-01T10:00:00Z", status: 400, want: "must be before to"},
		{name: "longer than retention", query: "from=2026-11-30T09:59:00Z&to=2026-12-01T10:00:00Z", status: 400, want: "at most the retention, 24h0m0s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBackend{}
			status, body := serve(t, newTestAPI(b, nil), http.MethodGet, "/pingback/history?"+tc.query, "")
			if status != tc.status {
				t.Fatalf("status %d (%s), want %d", status, body, tc.status)
			}
			if tc.status != 200 {
				if !strings.Contains(body, tc.want) {
					t.Errorf("error %q, want it to say %q", body, tc.want)
				}
				if len(b.historyAsked) != 0 {
					t.Errorf("bad input reached the backend: %v", b.historyAsked)
				}
				return
			}
			var ans adminapi.HistoryAnswer
			if err := json.Unmarshal([]byte(body), &ans); err != nil {
				t.Fatal(err)
			}
			if got := ans.From.Format(time.RFC3339); got != tc.from {
				t.Errorf("from %s, want %s", got, tc.from)
			}
			if got := ans.To.Format(time.RFC3339); got != tc.to {
				t.Errorf("to %s, want %s", got, tc.to)
			}
			if want := int(ans.To.Sub(ans.From) / time.Minute); len(ans.Points) != want || ans.StepSeconds != 60 {
				t.Errorf("%d points, step %d s; want %d, 60", len(ans.Points), ans.StepSeconds, want)
			}
		})
	}
}

// TestHistoryMerge checks the points of two instances' minute records:
// counts and buckets summed, the backlog the latest sample, percentiles
// interpolated within the merged buckets, and every minute present.
func TestHistoryMerge(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	buckets := func(pairs ...int) []uint64 {
		b := make([]uint64, store.HistoryBuckets)
		for i := 0; i < len(pairs); i += 2 {
			b[pairs[i]] = uint64(pairs[i+1])
		}
		return b
	}
	// Bucket 6 is (50 ms, 100 ms]; 7 is (100 ms, 250 ms].
	b := &fakeBackend{history: []store.HistoryMinute{
		{Minute: t0, Instance: "a", Received: map[string]int64{"stored": 3}, Deliveries: map[string]int64{"delivered": 3},
			Backlog: map[store.State]int64{"failed": 4}, SampledAt: t0.Add(61 * time.Second), Delay: buckets(6, 3), Age: buckets(7, 3)},
		{Minute: t0, Instance: "b", Received: map[string]int64{"stored": 1, "duplicate": 2}, Deliveries: map[string]int64{"delivered": 1, "failed": 1},
			Backlog: map[store.State]int64{"failed": 5}, SampledAt: t0.Add(62 * time.Second), Delay: buckets(7, 1), Age: buckets(7, 1)},
		{Minute: t0.Add(2 * time.Minute), Instance: "a", Received: map[string]int64{"poll_stored": 1}},
	}}
	status, body := serve(t, newTestAPI(b, nil), http.MethodGet, "/pingback/history?from=2026-12-01T10:00:00Z&to=2026-12-01T10:03:00Z", "")
	if status != 200 {
		t.Fatalf("status %d: %s", status, body)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatal(err)
	}
	want := `{"from":"2026-12-01T10:00:00Z","to":"2026-12-01T10:03:00Z","step_seconds":60,"points":[` +
		`{"minute":"2026-12-01T10:00:00Z","received":{"duplicate":2,"stored":4},"deliveries":{"delivered":4,"failed":1},"backlog":{"failed":5},` +
		`"delay_ms":{"count":4,"p50":83.333,"p95":220},"age_ms":{"count":4,"p50":175,"p95":242.5}},` +
		`{"minute":"2026-12-01T10:01:00Z","received":{},"deliveries":{},"backlog":{},"delay_ms":{"count":0,"p50":0,"p95":0},"age_ms":{"count":0,"p50":0,"p95":0}},` +
		`{"minute":"2026-12-01T10:02:00Z","received":{"poll_stored":1},"deliveries":{},"backlog":{},"delay_ms":{"count":0,"p50":0,"p95":0},"age_ms":{"count":0,"p50":0,"p95":0}}]}`
	var w map[string]any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Errorf("answer\n got %s\nwant %s", gb, wb)
	}
}
