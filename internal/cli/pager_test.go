package cli

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"testing"
)

// TestReadPages follows next_cursor until the limit or the last page,
// asks for no more than it still needs, and keeps the caller's filters.
func TestReadPages(t *testing.T) {
	type page struct {
		Items []int  `json:"items"`
		Next  string `json:"next_cursor,omitempty"`
	}
	const stored, serverMax = 25, 10
	var asked []int // the limit= of each request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("state") != "parked" {
			http.Error(w, `{"error":"filter lost"}`, http.StatusBadRequest)
			return
		}
		limit, _ := strconv.Atoi(q.Get("limit"))
		asked = append(asked, limit)
		from, _ := strconv.Atoi(q.Get("cursor"))
		var p page
		for i := from; i < stored && len(p.Items) < min(limit, serverMax); i++ {
			p.Items = append(p.Items, i)
		}
		if end := from + len(p.Items); end < stored {
			p.Next = strconv.Itoa(end)
		}
		_ = json.NewEncoder(w).Encode(p)
	}))
	defer srv.Close()
	c := &client{address: srv.Listener.Addr().String()}
	for _, tc := range []struct {
		name     string
		limit    int
		want     int
		wantNext string
		asked    []int
	}{
		{name: "all", limit: 100, want: stored, asked: []int{100, 90, 80}},
		{name: "limit within a page", limit: 4, want: 4, wantNext: "4", asked: []int{4}},
		{name: "limit across pages", limit: 12, want: 12, wantNext: "12", asked: []int{12, 2}},
		{name: "limit above a page's most", limit: 2500, want: stored, asked: []int{maxPage, maxPage, maxPage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			asked = nil
			q := url.Values{"state": {"parked"}}
			items, next, err := readPages(c, "/pingback/x", q, tc.limit, func(p *page) ([]int, string) { return p.Items, p.Next })
			if err != nil {
				t.Fatal(err)
			}
			if len(items) != tc.want || next != tc.wantNext {
				t.Errorf("got %d items, next %q; want %d, %q", len(items), next, tc.want, tc.wantNext)
			}
			for i, v := range items {
				if v != i {
					t.Fatalf("item %d is %d: pages out of order or repeated", i, v)
				}
			}
			if !slices.Equal(asked, tc.asked) {
				t.Errorf("asked for limits %v, want %v", asked, tc.asked)
			}
		})
	}
	t.Run("error", func(t *testing.T) {
		items, _, err := readPages(c, "/pingback/x", url.Values{}, 5, func(p *page) ([]int, string) { return p.Items, p.Next })
		if err == nil || items != nil {
			t.Fatalf("got %v, %v; want the API's error", items, err)
		}
		if want := "filter lost (HTTP 400)"; err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
	})
	t.Run("none", func(t *testing.T) {
		empty := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte(`{"items":null}`))
		}))
		defer empty.Close()
		items, next, err := readPages(&client{address: empty.Listener.Addr().String()}, "/pingback/x", url.Values{}, 5,
			func(p *page) ([]int, string) { return p.Items, p.Next })
		if err != nil || items == nil || len(items) != 0 || next != "" {
			t.Errorf("got %v (nil %v), %q, %v; want an empty list", items, items == nil, next, err)
		}
	})
}
