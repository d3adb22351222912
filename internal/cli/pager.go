package cli

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/spf13/cobra"
)

// maxPage is the most items the CLI asks the admin API for in one page.
const maxPage = 1000

// listQuery is the query of a paged list from the flags --state and
// --provider of cmd (each left out when empty).
func listQuery(cmd *cobra.Command) url.Values {
	q := url.Values{}
	for _, name := range []string{"state", "provider"} {
		if v, _ := cmd.Flags().GetString(name); v != "" {
			q.Set(name, v)
		}
	}
	return q
}

// listLimit reads the flag --limit of cmd: at least 1.
func listLimit(cmd *cobra.Command) (int, error) {
	limit, _ := cmd.Flags().GetInt("limit")
	if limit < 1 {
		return 0, fmt.Errorf("--limit must be at least 1, got %d", limit)
	}
	return limit, nil
}

// readPages reads the paged admin route path (GET path?q) page by page,
// following next_cursor, until it has limit items or the last page.
// P is the route's page (adminapi.RecordsPage, adminapi.TasksPage) and
// split gives a page's items and its next cursor. It returns the items
// (an empty slice, not nil, for none) and the last page's next cursor
// ("" when there is no more). q gets limit= and cursor= set.
func readPages[P, T any](c *client, path string, q url.Values, limit int, split func(*P) ([]T, string)) ([]T, string, error) {
	all := []T{}
	next := ""
	for {
		q.Set("limit", strconv.Itoa(min(limit-len(all), maxPage)))
		var page P
		if _, err := c.call(http.MethodGet, path+"?"+q.Encode(), nil, &page); err != nil {
			return nil, "", err
		}
		var items []T
		items, next = split(&page)
		all = append(all, items...)
		if next == "" || len(all) >= limit {
			return all, next, nil
		}
		q.Set("cursor", next)
	}
}
