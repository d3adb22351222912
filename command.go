package pingback

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/drill"
)

// subcommands build the subcommands of `caddy pingback`, one per file
// that implements one (status, records, replay, drill, ...). They are
// called when Caddy builds its command line, after every init has run.
var subcommands []func() *cobra.Command

// addSubcommand adds a subcommand of `caddy pingback`; call it from init.
func addSubcommand(build func() *cobra.Command) {
	subcommands = append(subcommands, build)
}

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "pingback",
		Usage: "<command> [flags]",
		Short: "Inspects and operates the pingback plugin",
		Long: `
Inspects and operates the pingback plugin of a running Caddy through its
admin endpoint, and rehearses failures on a copy of a config.
Run 'caddy pingback help <command>' for a command's flags.`,
		CobraFunc: func(cmd *cobra.Command) {
			for _, build := range subcommands {
				cmd.AddCommand(build())
			}
		},
	})
}

// `caddy pingback drill` reads configs against the plugin's own defaults.
func init() {
	addSubcommand(func() *cobra.Command {
		return drill.Command(drill.Defaults{
			AckTimeout: DefaultAckTimeout, BackoffMin: DefaultBackoffMin, BackoffMax: DefaultBackoffMax,
			PollInterval: DefaultPollInterval, GiveUp: DefaultGiveUp,
			AutoAfterMin: autoAfterMin, AutoAfterMax: autoAfterMax,
			VerifyToken: VerifyToken, VerifyNone: VerifyNone, UnknownAccept: UnknownAccept,
		})
	})
}
