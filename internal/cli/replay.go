package cli

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// replayCommand is `caddy pingback replay`.
func replayCommand() *cobra.Command {
	cmd := adminCommand(&cobra.Command{
		Use:   "replay <provider> <id> [--force] | replay --state <state> [--provider <name>] [--since <time>]",
		Short: "Replays one stored result, or every one in a state, to the app now",
		Long: `
With <provider> <id>: replays one stored result now, through the same route
as its first forward (POST /pingback/records/<provider>/<id>/replay), and
shows it after the attempt. A result the app already has (delivered) is
refused unless --force.

With --state (parked, failed, rejected, expired or queued): starts a bulk replay
(POST /pingback/replays) of every result in that state (of --provider, and
received after --since: RFC 3339 or a duration such as 2h), and waits for it
with a progress bar on a terminal, one progress line a second otherwise.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if state, _ := cmd.Flags().GetString("state"); state != "" {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
	}, runReplay)
	cmd.Flags().Bool("force", false, "Replay a delivered result too")
	cmd.Flags().String("state", "", "Replay every result in this state (bulk)")
	cmd.Flags().String("provider", "", "With --state: only this provider's results")
	cmd.Flags().String("since", "", "With --state: only results received after this (RFC 3339, or a duration ago)")
	return cmd
}

// runReplay replays one result, or with --state starts a bulk replay.
func runReplay(c *client, args []string) error {
	if state, _ := c.cmd.Flags().GetString("state"); state != "" {
		return bulkReplay(c, state)
	}
	uri := recordPath(args[0], args[1]) + "/replay"
	if force, _ := c.cmd.Flags().GetBool("force"); force {
		uri += "?force=true"
	}
	return recordAnswer(c, http.MethodPost, uri, false)
}

// bulkReplay starts a bulk replay and waits for it.
func bulkReplay(c *client, state string) error {
	fs := c.cmd.Flags()
	f := adminapi.ReplayFilter{State: store.State(state)}
	f.Provider, _ = fs.GetString("provider")
	since, _ := fs.GetString("since")
	var err error
	if f.ReceivedAfter, err = flagTime("since", since); err != nil {
		return err
	}
	var job adminapi.ReplayJobState
	if _, err := c.call(http.MethodPost, "/pingback/replays", f, &job); err != nil {
		return err
	}
	out := c.cmd.OutOrStdout()
	bar := isTerminal(out) && !c.json
	for {
		raw, err := c.call(http.MethodGet, "/pingback/replays/"+url.PathEscape(job.ID), nil, &job)
		if err != nil {
			return err
		}
		switch {
		case job.Status != "running" && c.json:
			c.printJSON(raw)
		case bar:
			fmt.Fprintf(out, "\r%s", progressBar(job))
		case !c.json:
			fmt.Fprintf(out, "replay %s: %s, %d/%d done, %d delivered, %d failed\n", job.ID, job.Status, job.Done, job.Matched, job.Delivered, job.Failed)
		}
		if job.Status != "running" {
			if bar {
				fmt.Fprintln(out)
			}
			if job.Status == "cancelled" {
				return fmt.Errorf("bulk replay %s cancelled after %d of %d", job.ID, job.Done, job.Matched)
			}
			return nil
		}
		time.Sleep(time.Second) // the progress line's pace, not a synchronisation
	}
}

// progressBar draws a job's progress in 40 columns.
func progressBar(j adminapi.ReplayJobState) string {
	const width = 40
	n := width
	if j.Matched > 0 {
		n = width * j.Done / j.Matched
	}
	return fmt.Sprintf("[%s%s] %d/%d, %d delivered, %d failed", strings.Repeat("#", n), strings.Repeat(".", width-n),
		j.Done, j.Matched, j.Delivered, j.Failed)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
