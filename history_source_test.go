package pingback

import (
	"slices"
	"testing"

	"github.com/caddy-pingback/pingback/internal/store"
)

// wantHistorySources checks the sources of a stored record's attempts,
// in order: the history names each forward as the app was sent it
// (X-Pingback-Source), manual and bulk replays apart.
func wantHistorySources(t *testing.T, provider, id string, want ...store.Source) {
	t.Helper()
	rec := getRecord(t, provider, id)
	var got []store.Source
	for _, a := range rec.History {
		got = append(got, a.Source)
	}
	if !slices.Equal(got, want) {
		t.Errorf("history of %s:%s has sources %v, want %v", provider, id, got, want)
	}
}
