package cli

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// purgeCommand is `caddy pingback purge`.
func purgeCommand() *cobra.Command {
	cmd := adminCommand(&cobra.Command{
		Use:   "purge <provider> <id> | purge [--state <state>] [--provider <name>] [--before <time>]",
		Short: "Erases stored results for good (the right to erasure)",
		Long: `
With <provider> <id>: erases one stored result and its task
(DELETE /pingback/records/<provider>/<id>).

With filters (at least one of --state, --provider, --before): erases every
result they match (POST /pingback/purges); --before takes an RFC 3339 time
or a duration ago such as 720h.

A purged result is never listed or replayed again, and a re-sent pingback
of it is answered as a duplicate without reaching the app, until its
retention ends. On Badger its bytes are gone from the store's files when
the command returns.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if purgeFiltered(cmd) {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(2)(cmd, args)
		},
	}, runPurge)
	cmd.Flags().String("state", "", "Erase every result in this state")
	cmd.Flags().String("provider", "", "Erase every result of this provider (with the other filters: only those)")
	cmd.Flags().String("before", "", "Erase every result received before this (RFC 3339, or a duration ago)")
	return cmd
}

// purgeFiltered reports whether a filter flag was given.
func purgeFiltered(cmd *cobra.Command) bool {
	for _, name := range []string{"state", "provider", "before"} {
		if v, _ := cmd.Flags().GetString(name); v != "" {
			return true
		}
	}
	return false
}

func runPurge(c *client, args []string) error {
	var ans adminapi.PurgeAnswer
	var raw []byte
	var err error
	if len(args) == 2 {
		raw, err = c.call(http.MethodDelete, recordPath(args[0], args[1]), nil, &ans)
	} else {
		fs := c.cmd.Flags()
		var f adminapi.ReplayFilter
		state, _ := fs.GetString("state")
		f.State = store.State(state)
		f.Provider, _ = fs.GetString("provider")
		before, _ := fs.GetString("before")
		if f.ReceivedBefore, err = flagTime("before", before); err != nil {
			return err
		}
		if !purgeFiltered(c.cmd) {
			return errors.New("give <provider> <id>, or at least one of --state, --provider and --before")
		}
		raw, err = c.call(http.MethodPost, "/pingback/purges", f, &ans)
	}
	if err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	noun := "results"
	if ans.Purged == 1 {
		noun = "result"
	}
	_, err = fmt.Fprintf(c.cmd.OutOrStdout(), "purged %d %s\n", ans.Purged, noun)
	return err
}
