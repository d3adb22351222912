package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// tasksCommand is `caddy pingback tasks`.
func tasksCommand() *cobra.Command {
	cmd := adminCommand(&cobra.Command{
		Use:   "tasks [--state pending|done|expired] [--provider <name>] [--account <id>] [--limit <n>]",
		Short: "Lists tracked tasks (those the poller recovers results for), by submission time",
		Long: `Lists tracked tasks, those the poller recovers results for, ordered by
submission time (submitted_at), then provider and id, read page by page
through GET /pingback/tasks. Each task shows its account: the account id
of the API key it was submitted with ("caddy pingback status" lists the
accounts and their api_key entries); --account lists one account's tasks,
for example the pending tasks of a key being rotated out.`,
		Args: cobra.NoArgs,
	}, runTasks)
	cmd.Flags().String("state", "", "Only tasks in this state (pending, done, expired)")
	cmd.Flags().String("provider", "", "Only this provider's tasks")
	cmd.Flags().String("account", "", "Only the tasks of this account id (16 hex characters, as status shows it)")
	cmd.Flags().Int("limit", 100, "At most this many tasks (read page by page)")
	return cmd
}

func runTasks(c *client, _ []string) error {
	q := listQuery(c.cmd)
	if account, _ := c.cmd.Flags().GetString("account"); account != "" {
		q.Set("account", account)
	}
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
	return writeTasks(c.cmd.OutOrStdout(), ans.Tasks)
}

// writeTasks writes tasks as `caddy pingback tasks` shows them, one row
// each in the order given; a task without an account (its submission
// carried no key) shows "-".
func writeTasks(out io.Writer, tasks []*store.Task) error {
	w := newTable(out)
	fmt.Fprintln(w, "PROVIDER\tID\tACCOUNT\tSTATE\tSUBMITTED\tPOLLS\tNEXT POLL\tRESULT AT\tLAST ERROR")
	for _, t := range tasks {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", t.Provider, t.ID, orDash(t.Account), t.State, fmtTime(t.SubmittedAt), t.Polls,
			fmtTime(t.NextPollAt), fmtTime(t.ResultAt), orDash(t.LastError))
	}
	return w.Flush()
}
