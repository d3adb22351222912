package cli

import (
	"net/http"

	"github.com/spf13/cobra"
)

// releaseCommand is `caddy pingback release`.
func releaseCommand() *cobra.Command {
	return adminCommand(&cobra.Command{
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
	}, runRelease)
}

func runRelease(c *client, args []string) error {
	return recordAnswer(c, http.MethodPost, recordPath(args[0], args[1])+"/release", false)
}
