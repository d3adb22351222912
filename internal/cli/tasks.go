package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// tasksCommand is `caddy pingback tasks`.
func tasksCommand() *cobra.Command {
	cmd := adminCommand(&cobra.Command{
		Use:   "tasks [--state pending|done|expired] [--provider <name>] [--limit <n>]",
		Short: "Lists tracked tasks (those the poller recovers results for), by submission time",
		Long: `Lists tracked tasks, those the poller recovers results for, ordered by
submission time (submitted_at), then provider and id, read page by page
through GET /pingback/tasks.`,
		Args: cobra.NoArgs,
	}, runTasks)
	cmd.Flags().String("state", "", "Only tasks in this state (pending, done, expired)")
	cmd.Flags().String("provider", "", "Only this provider's tasks")
	cmd.Flags().Int("limit", 100, "At most this many tasks (read page by page)")
	return cmd
}

func runTasks(c *client, _ []string) error {
	q := listQuery(c.cmd)
	limit, err := listLimit(c.cmd)
	if err != nil {
		return err
	}
	var ans adminapi.TasksPage
	ans.Tasks, ans.NextCursor, err = readPages(c, "/pingback/tasks", q, limit,
		func(p *adminapi.TasksPage) ([]*store.Task, string) { return p.Tasks, p.NextCursor })
	if err != nil {
		return err
	}
	if c.json {
		return c.printValue(ans)
	}
	w := c.table()
	fmt.Fprintln(w, "PROVIDER\tID\tSTATE\tSUBMITTED\tPOLLS\tNEXT POLL\tRESULT AT\tLAST ERROR")
	for _, t := range ans.Tasks {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", t.Provider, t.ID, t.State, fmtTime(t.SubmittedAt), t.Polls,
			fmtTime(t.NextPollAt), fmtTime(t.ResultAt), orDash(t.LastError))
	}
	return w.Flush()
}
