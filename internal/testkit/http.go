package testkit

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Get sends a GET to url with http.DefaultClient and returns the status
// and body; a request that gets no answer fails t.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// PostForm sends form (application/x-www-form-urlencoded) in a POST to url
// with http.DefaultClient and returns the status and body; a request that
// gets no answer fails t.
func PostForm(t testing.TB, url, form string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/x-www-form-urlencoded", strings.NewReader(form))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
