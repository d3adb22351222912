package pingback

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/cli"
)

// subcommands build the subcommands of `caddy pingback` that live in the
// root package (the drill), added after those of internal/cli. They are
// called when Caddy builds its command line, after every init has run.
var subcommands []func() *cobra.Command

// addSubcommand adds a subcommand of `caddy pingback`; call it from init.
func addSubcommand(build func() *cobra.Command) {
	subcommands = append(subcommands, build)
}

// pingbackCommands builds every subcommand of `caddy pingback`: those
// that talk to the admin endpoint (internal/cli), then those added with
// addSubcommand.
func pingbackCommands() []*cobra.Command {
	cmds := cli.Commands()
	for _, build := range subcommands {
		cmds = append(cmds, build())
	}
	return cmds
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
			cmd.AddCommand(pingbackCommands()...)
		},
	})
}
