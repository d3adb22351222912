package admin

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// A cursor is base64url (no padding) of a JSON array [time in Unix ns,
// provider, id]: for records the received time, for tasks the submission
// time. A task cursor of the order before (by provider and id: [provider,
// id]) is refused (400).

// errBadCursor is the reason of a cursor this API did not give.
var errBadCursor = errors.New("cursor is not a next_cursor this API gave")

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
