package pingback

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/cli"
	"github.com/caddy-pingback/pingback/internal/drill"
)

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
			cmd.AddCommand(pingbackCommands()...)
		},
	})
}

// pingbackCommands builds every subcommand of `caddy pingback`: those
// that talk to the admin endpoint (internal/cli), then the drill
// (internal/drill), which reads configs against this package's defaults.
func pingbackCommands() []*cobra.Command {
	return append(cli.Commands(), drill.Command(drill.Defaults{
		AckTimeout:    DefaultAckTimeout,
		BackoffMin:    DefaultBackoffMin,
		BackoffMax:    DefaultBackoffMax,
		PollInterval:  DefaultPollInterval,
		GiveUp:        DefaultGiveUp,
		AutoAfterMin:  autoAfterMin,
		AutoAfterMax:  autoAfterMax,
		VerifyToken:   VerifyToken,
		VerifyNone:    VerifyNone,
		UnknownAccept: UnknownAccept,
	}))
}
