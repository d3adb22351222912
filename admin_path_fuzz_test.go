package pingback

import (
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
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
