package pingback

import (
	"net/http"

	"github.com/spf13/cobra"
)

func init() {
	addSubcommand(func() *cobra.Command {
		cmd := &cobra.Command{
			Use:   "release <provider> <id>",
			Short: "Delivers one quarantined result to the app now",
			Long: `
Releases one quarantined result (a pingback the handler did not trust: a
wrong or missing token, an unknown task id, a code the provider did not
confirm): it leaves quarantine and is delivered once now, through the same
route as a replay (POST /pingback/records/<provider>/<id>/release), with
X-Pingback-Verified: none. Shows the result after the attempt. A result that
is not quarantined is refused.`,
			Args: cobra.ExactArgs(2),
		}
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			return cliRun(func(c *cliClient) error { return cliRelease(c, args[0], args[1]) })(cmd, args)
		}
		adminFlags(cmd)
		return cmd
	})
}

func cliRelease(c *cliClient, provider, id string) error {
	return cliRecordAnswer(c, http.MethodPost, recordPath(provider, id)+"/release", false)
}
