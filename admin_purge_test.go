package pingback

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testfs"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestAdminPurge erases results through the admin API of a real Caddy:
// one by key (its marker is gone from the storage directory's files when
// the answer comes), then by filter; a re-sent pingback of a purged result
// is answered 200 and not forwarded; a purged result is not shown, listed
// or replayed; the counts drop; bad input changes nothing.
func TestAdminPurge(t *testing.T) {
	app := newAppStub(t)
	dir := startCaddy(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))
	rnd := make([]byte, 12)
	_, _ = rand.Read(rnd)
	marker := "ERASE" + hex.EncodeToString(rnd)
	for _, id := range []string{"601", "602"} {
		if code, body := testkit.PostForm(t, testBase+"/cb", "id="+id+"&code="+marker+id); code != http.StatusOK || body != "OK" {
			t.Fatalf("pingback %s: %d %q", id, code, body)
		}
		waitForState(t, 5*time.Second, "2captcha", id, store.StateDelivered)
	}
	app.SetStatus(http.StatusServiceUnavailable)
	for _, id := range []string{"611", "612"} {
		if code, _ := testkit.PostForm(t, testBase+"/cb", "id="+id+"&code=P"+id); code != http.StatusOK {
			t.Fatalf("pingback %s refused", id)
		}
		waitForState(t, 5*time.Second, "2captcha", id, store.StateParked)
	}
	app.SetStatus(http.StatusOK)
	if got := testfs.FilesContaining(t, dir, []byte(marker+"601")); len(got) == 0 {
		t.Fatal("the marker is in no file of the store before the purge: the test cannot tell")
	}

	status, body := adminDo(t, http.MethodDelete, "/pingback/records/2captcha/601", "")
	if status != http.StatusOK || string(body) != `{"purged":1}`+"\n" {
		t.Fatalf("DELETE: %d %s, want 200 {\"purged\":1}", status, body)
	}
	if got := testfs.FilesContaining(t, dir, []byte(marker+"601")); len(got) != 0 {
		t.Errorf("after the purge the marker is still in %v", got)
	}
	if got := testfs.FilesContaining(t, dir, []byte(marker+"602")); len(got) == 0 {
		t.Error("the purge erased another result's bytes too")
	}

	// The provider sends it again: a duplicate, not forwarded.
	dups, _ := scrapeMetric(t, `caddy_pingback_callbacks_total{provider="2captcha",result="duplicate"}`)
	if code, body := testkit.PostForm(t, testBase+"/cb", "id=601&code="+marker+"601"); code != http.StatusOK || body != "OK" {
		t.Errorf("re-sent pingback of a purged result: %d %q, want 200 OK", code, body)
	}
	if n := app.Count("2captcha:601"); n != 1 {
		t.Errorf("the app got 2captcha:601 %d times, want 1 (the re-sent one is not forwarded)", n)
	}
	if v, ok := scrapeMetric(t, `caddy_pingback_callbacks_total{provider="2captcha",result="duplicate"}`); !ok || v != dups+1 {
		t.Errorf("duplicate callbacks: %v %v, want one more than %v", v, ok, dups)
	}
	if got := testfs.FilesContaining(t, dir, []byte(marker+"601")); len(got) != 0 {
		// The re-sent body was never stored.
		t.Errorf("after the re-sent pingback the marker is in %v", got)
	}
	for _, tc := range []struct {
		method, path string
		status       int
		reason       string
	}{
		{http.MethodGet, "/pingback/records/2captcha/601", http.StatusNotFound, "purged"},
		{http.MethodPost, "/pingback/records/2captcha/601/replay", http.StatusNotFound, "purged"},
		{http.MethodDelete, "/pingback/records/2captcha/601", http.StatusNotFound, "already purged"},
		{http.MethodDelete, "/pingback/records/2captcha/999", http.StatusNotFound, "no stored result"},
		{http.MethodDelete, "/pingback/records/2captcha/", http.StatusNotFound, "not found"},
	} {
		status, body := adminDo(t, tc.method, tc.path, "")
		if status != tc.status || !strings.Contains(string(body), tc.reason) {
			t.Errorf("%s %s: %d %s, want %d saying %q", tc.method, tc.path, status, body, tc.status, tc.reason)
		}
	}
	if got := listPages(t, map[string][]string{"limit": {"100"}}); strings.Contains(strings.Join(got, " "), "2captcha:601") {
		t.Errorf("the purged result is listed: %v", got)
	}

	// Bad filters: 400, nothing purged.
	for _, body := range []string{``, `{}`, `{"state": "lost"}`, `{"provider": "deathbycaptcha"}`,
		`{"received_before": "yesterday"}`, `{"state": "parked", "force": true}`, `[`} {
		status, b := adminDo(t, http.MethodPost, "/pingback/purges", body)
		if status != http.StatusBadRequest || !strings.Contains(string(b), `"error"`) {
			t.Errorf("POST /pingback/purges %s: %d %s, want 400 with an error", body, status, b)
		}
	}
	if status, _ := adminDo(t, http.MethodGet, "/pingback/purges", ""); status != http.StatusMethodNotAllowed {
		t.Errorf("GET /pingback/purges: %d, want 405", status)
	}
	if n := len(listPages(t, map[string][]string{"limit": {"100"}})); n != 3 {
		t.Errorf("after bad purges %d results are listed, want 3", n)
	}

	// By filter: the parked ones; the counts drop.
	status, b := adminDo(t, http.MethodPost, "/pingback/purges", `{"state": "parked", "received_after": "`+
		time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)+`"}`)
	if status != http.StatusOK || string(b) != `{"purged":2}`+"\n" {
		t.Fatalf("POST /pingback/purges parked: %d %s, want {\"purged\":2}", status, b)
	}
	for _, id := range []string{"611", "612"} {
		if status, _ := adminDo(t, http.MethodGet, "/pingback/records/2captcha/"+id, ""); status != http.StatusNotFound {
			t.Errorf("GET %s after the purge: %d, want 404", id, status)
		}
	}
	getRecord(t, "2captcha", "602")
	if v, ok := scrapeMetric(t, `caddy_pingback_records{provider="2captcha",state="parked"}`); ok && v != 0 {
		t.Errorf("records{parked} = %v after the purge, want 0", v)
	}
	if v, ok := scrapeMetric(t, `caddy_pingback_records{provider="2captcha",state="delivered"}`); !ok || v != 1 {
		t.Errorf("records{delivered} = %v %v after the purges, want 1", v, ok)
	}
	var st struct {
		Records map[string]map[string]int `json:"records"`
	}
	if status, body := adminDo(t, http.MethodGet, "/pingback/status", ""); status != http.StatusOK || json.Unmarshal(body, &st) != nil ||
		st.Records["2captcha"]["parked"] != 0 || st.Records["2captcha"]["delivered"] != 1 {
		t.Errorf("status after the purges: %d %s", status, body)
	}
}
