package pingback

import (
	"net/http"
	"net/url"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	addSubcommand(func() *cobra.Command {
		cmd := &cobra.Command{
			Use:   "replay <provider> <id> [--force]",
			Short: "Replays one stored result to the app now, and shows it after the attempt",
			Long: `
Replays one stored result now, through the same route as its first forward
(POST /pingback/records/<provider>/<id>/replay). A result the app already
has (delivered) is refused unless --force.`,
			Args: cobra.ExactArgs(2),
		}
		cmd.Flags().Bool("force", false, "Replay a delivered result too")
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			return cliRun(func(c *cliClient) error { return cliReplay(c, args[0], args[1]) })(cmd, args)
		}
		adminFlags(cmd)
		return cmd
	})
}

func cliReplay(c *cliClient, provider, id string) error {
	uri := "/pingback/records/" + url.PathEscape(provider) + "/" + url.PathEscape(id) + "/replay"
	if force, _ := c.cmd.Flags().GetBool("force"); force {
		uri += "?force=true"
	}
	var r store.Record
	raw, err := c.call(http.MethodPost, uri, nil, &r)
	if err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	printRecord(c, &r)
	return nil
}
