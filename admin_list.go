package pingback

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// handleListRecords answers GET /pingback/records?provider=&state=&
// received_after=&received_before=&limit=&cursor=: {"records": [...],
// "next_cursor": "..."}, at most limit records (default 100, at most
// 10000) ordered by received time, then provider and id; next_cursor,
// absent on the last page, asks for the next one (cursor=). The times are
// RFC 3339, both exclusive. A page costs what it holds, however many
// results are stored. Bad filters and cursors answer 400.
func handleListRecords(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return caddy.APIError{HTTPStatus: http.StatusMethodNotAllowed, Err: fmt.Errorf("method %s not allowed: use GET", r.Method)}
	}
	q := r.URL.Query()
	f := adminapi.ReplayFilter{Provider: q.Get("provider"), State: store.State(q.Get("state")),
		ReceivedAfter: q.Get("received_after"), ReceivedBefore: q.Get("received_before")}
	if err := f.Parse(knownProvider); err != nil {
		return badInput("%v", err)
	}
	limit, err := listLimit(q)
	if err != nil {
		return err
	}
	lq := store.ListQuery{Provider: f.Provider, State: f.State, ReceivedAfter: exclusiveAfter(f.After()), ReceivedBefore: f.Before(), Limit: limit}
	if c := q.Get("cursor"); c != "" {
		pos, err := decodeRecordCursor(c)
		if err != nil {
			return badInput("%v", err)
		}
		lq.After = &pos
	}
	st, err := adminStore()
	if err != nil {
		return err
	}
	page, err := st.ListPage(r.Context(), lq)
	if err != nil {
		return caddy.APIError{HTTPStatus: http.StatusInternalServerError, Err: err}
	}
	ans := adminapi.RecordsPage{Records: publicRecords(page.Records)}
	if page.Next != nil {
		ans.NextCursor = encodeRecordCursor(*page.Next)
	}
	return writeJSON(w, ans)
}

// exclusiveAfter turns an exclusive lower bound into the store's
// inclusive one.
func exclusiveAfter(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(time.Nanosecond)
}

// listLimit reads limit: default 100, 1 to 10000.
func listLimit(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 10000 {
		return 0, badInput("limit must be a whole number from 1 to 10000, got %q", v)
	}
	return n, nil
}

// errBadCursor is the reason of a cursor this API did not give.
var errBadCursor = errors.New("cursor is not a next_cursor this API gave")

// A cursor is base64url (no padding) of a JSON array [time in Unix ns,
// provider, id]: for records the received time, for tasks the submission
// time. A task cursor of the order before (by provider and id: [provider,
// id]) is refused (400).
func encodeRecordCursor(p store.Position) string { return encodeCursor(p.ReceivedAt, p.Key) }

func decodeRecordCursor(s string) (store.Position, error) {
	at, k, err := decodeCursor(s)
	return store.Position{ReceivedAt: at, Key: k}, err
}

func encodeTaskCursor(p store.TaskPosition) string { return encodeCursor(p.SubmittedAt, p.Key) }

func decodeTaskCursor(s string) (store.TaskPosition, error) {
	at, k, err := decodeCursor(s)
	return store.TaskPosition{SubmittedAt: at, Key: k}, err
}

func encodeCursor(at time.Time, k store.Key) string {
	var ns int64
	if !at.IsZero() {
		ns = at.UnixNano()
	}
	b, _ := json.Marshal([]any{ns, k.Provider, k.ID})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (time.Time, store.Key, error) {
	var parts []json.RawMessage
	var ns int64
	var k store.Key
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || json.Unmarshal(b, &parts) != nil || len(parts) != 3 ||
		json.Unmarshal(parts[0], &ns) != nil || json.Unmarshal(parts[1], &k.Provider) != nil || json.Unmarshal(parts[2], &k.ID) != nil ||
		k.Provider == "" || k.ID == "" || ns < 0 {
		return time.Time{}, store.Key{}, errBadCursor
	}
	if ns == 0 {
		return time.Time{}, k, nil
	}
	return time.Unix(0, ns).UTC(), k, nil
}
