// Package cli is `caddy pingback`'s subcommands that speak to the admin
// endpoint of a running Caddy: status, records, show, replay, release,
// purge, tasks, pause and resume. They only send HTTP requests to the
// plugin's admin API and print its answers (the shapes of
// internal/adminapi); the root package registers them under `caddy
// pingback`.
//
// Every subcommand takes the same flags:
//
//	--address  the admin endpoint (as `caddy reload --address`); without
//	           it, the one the --config file names, else localhost:2019
//	--config, --adapter  the config file to read the admin address from
//	--json     print the admin API's JSON as it came; errors as
//	           {"error": "..."} on stderr
//
// Errors go to stderr and the command exits with status 1; an admin
// endpoint that cannot be reached is named in the error.
package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"
)

// Commands builds the subcommands of `caddy pingback` that talk to the
// admin endpoint, in the order they are added: purge, records, show,
// release, replay, status, tasks, pause, resume. Each call builds new commands.
func Commands() []*cobra.Command {
	return []*cobra.Command{
		purgeCommand(),
		recordsCommand(),
		showCommand(),
		releaseCommand(),
		replayCommand(),
		statusCommand(),
		tasksCommand(),
		pauseCommand(),
		resumeCommand(),
	}
}

// adminCommand makes cmd (its Use, Short, Long and Args set) a subcommand
// that talks to the admin endpoint: it adds the shared flags, and its run
// gets a client for the endpoint they name and the arguments. run's error
// is printed to stderr (as {"error": ...} with --json) and fails the
// command.
func adminCommand(cmd *cobra.Command, run func(c *client, args []string) error) *cobra.Command {
	cmd.Flags().String("address", "", "Address of the administration endpoint (default: the config's, else localhost:2019)")
	cmd.Flags().StringP("config", "c", "", "Configuration file to read the admin address from")
	cmd.Flags().StringP("adapter", "a", "", "Name of the config adapter for --config")
	cmd.Flags().Bool("json", false, "Print the admin API's JSON")
	cmd.SilenceUsage = true
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		cmd.SilenceErrors = true // printed here, as text or JSON (flag and argument errors by cobra)
		c, err := newClient(cmd)
		if err == nil {
			err = run(c, args)
		}
		if err == nil {
			return nil
		}
		w := cmd.ErrOrStderr()
		if c.json {
			b, _ := json.Marshal(map[string]string{"error": err.Error()})
			fmt.Fprintf(w, "%s\n", b)
		} else {
			fmt.Fprintf(w, "Error: %v\n", err)
		}
		return err
	}
	return cmd
}
