package pingback

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	addSubcommand(func() *cobra.Command {
		cmd := &cobra.Command{
			Use:   "tasks [--state pending|done|expired] [--provider <name>] [--limit <n>]",
			Short: "Lists tracked tasks (those the poller recovers results for), by submission time",
			Long: `Lists tracked tasks, those the poller recovers results for, ordered by
submission time (submitted_at), then provider and id, read page by page
through GET /pingback/tasks.`,
			Args: cobra.NoArgs,
			RunE: cliRun(cliTasks),
		}
		cmd.Flags().String("state", "", "Only tasks in this state (pending, done, expired)")
		cmd.Flags().String("provider", "", "Only this provider's tasks")
		cmd.Flags().Int("limit", 100, "At most this many tasks (read page by page)")
		adminFlags(cmd)
		return cmd
	})
}

func cliTasks(c *cliClient) error {
	fs := c.cmd.Flags()
	q := url.Values{}
	if v, _ := fs.GetString("state"); v != "" {
		q.Set("state", v)
	}
	if v, _ := fs.GetString("provider"); v != "" {
		q.Set("provider", v)
	}
	limit, _ := fs.GetInt("limit")
	if limit < 1 {
		return fmt.Errorf("--limit must be at least 1, got %d", limit)
	}
	// Page through the cursor until limit tasks or the last page.
	ans := adminapi.TasksPage{Tasks: []*store.Task{}}
	for {
		q.Set("limit", strconv.Itoa(min(limit-len(ans.Tasks), 1000)))
		var page adminapi.TasksPage
		if _, err := c.call(http.MethodGet, "/pingback/tasks?"+q.Encode(), nil, &page); err != nil {
			return err
		}
		ans.Tasks, ans.NextCursor = append(ans.Tasks, page.Tasks...), page.NextCursor
		if page.NextCursor == "" || len(ans.Tasks) >= limit {
			break
		}
		q.Set("cursor", page.NextCursor)
	}
	if c.json {
		raw, err := json.Marshal(ans)
		if err != nil {
			return err
		}
		c.printJSON(raw)
		return nil
	}
	w := tabwriter.NewWriter(c.cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "PROVIDER\tID\tSTATE\tSUBMITTED\tPOLLS\tNEXT POLL\tRESULT AT\tLAST ERROR")
	for _, t := range ans.Tasks {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", t.Provider, t.ID, t.State, fmtTime(t.SubmittedAt), t.Polls,
			fmtTime(t.NextPollAt), fmtTime(t.ResultAt), orDash(t.LastError))
	}
	return w.Flush()
}

// fmtTime is t in RFC 3339 (UTC), "-" for the zero time.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
