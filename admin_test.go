package pingback

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// TestAdminPathEscapedSegments checks that %2F inside a path segment of
// the admin API is part of the segment, not a separator.
func TestAdminPathEscapedSegments(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	if s, b := testkit.PostForm(t, testBase+"/cb", "id=77&code=TOKEN-77"); s != 200 {
		t.Fatalf("pingback: %d %s", s, b)
	}
	cases := []struct {
		method, path string
		status       int
		want         string
	}{
		// Split on the decoded path, "77%2Freplay" would be the id 77
		// and the replay action.
		{http.MethodPost, "/pingback/records/2captcha/77%2Freplay", http.StatusMethodNotAllowed, "use GET"},
		{http.MethodGet, "/pingback/records/2captcha/77%2Freplay", http.StatusNotFound, "no stored result 2captcha:77/replay"},
		{http.MethodGet, "/pingback/records/2captcha%2F77", http.StatusNotFound, "not found: use"},
		{http.MethodGet, "/pingback/tasks/2captcha/1%2F2", http.StatusNotFound, "no tracked task 2captcha:1/2"},
		{http.MethodGet, "/pingback/records/2captcha/77", http.StatusOK, `"id":"77"`},
	}
	for _, c := range cases {
		status, body := adminDo(t, c.method, c.path, "")
		if status != c.status || !strings.Contains(string(body), c.want) {
			t.Errorf("%s %s: %d %s, want %d with %q", c.method, c.path, status, body, c.status, c.want)
		}
	}
	if n := app.Count("2captcha:77"); n != 1 {
		t.Errorf("the app got 2captcha:77 %d times, want once (no replay by an escaped path)", n)
	}
}
