package cli

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
)

// pauseCommand is `caddy pingback pause`.
func pauseCommand() *cobra.Command {
	cmd := adminCommand(&cobra.Command{
		Use:   "pause <provider|*> [--reason R] [--until T]",
		Short: "Holds the deliveries of a provider (or of every provider: *) until resumed",
		Long: `
Pauses the deliveries of a provider, every route of it, polled results
included (POST /pingback/pauses), or of every provider with *. While paused,
its pingbacks are received, verified, stored and answered as always, but
nothing of it is forwarded to the app and no attempt is spent: the results
are held (queued) until 'caddy pingback resume', or until --until (an RFC
3339 time, or a duration from now such as 30m). Pausing a provider already
paused changes its reason and end. The pause survives reloads and restarts
and, on PostgreSQL, holds on every instance within a second.`,
		Args: cobra.ExactArgs(1),
	}, runPause)
	cmd.Flags().String("reason", "", "Why the provider is paused (shown by status)")
	cmd.Flags().String("until", "", "When the pause ends by itself: an RFC 3339 time, or a duration from now (30m)")
	return cmd
}

// resumeCommand is `caddy pingback resume`.
func resumeCommand() *cobra.Command {
	return adminCommand(&cobra.Command{
		Use:   "resume <provider|*>",
		Short: "Resumes the deliveries of a paused provider",
		Long: `
Removes the pause of a provider (DELETE /pingback/pauses/<provider>); *
removes only the pause of every provider, not the providers' own. The held
results are then delivered through the replay loop, in the order they were
received, with the same fair claims and flow control as any backlog.`,
		Args: cobra.ExactArgs(1),
	}, runResume)
}

func runPause(c *client, args []string) error {
	req := adminapi.PauseRequest{Provider: args[0], By: "cli"}
	req.Reason, _ = c.cmd.Flags().GetString("reason")
	u, _ := c.cmd.Flags().GetString("until")
	until, err := flagUntil(u, time.Now())
	if err != nil {
		return err
	}
	req.Until = until
	var p adminapi.Pause
	raw, err := c.call(http.MethodPost, "/pingback/pauses", req, &p)
	if err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	out := c.cmd.OutOrStdout()
	fmt.Fprintf(out, "paused %s since %s", p.Provider, fmtTime(p.Since))
	if p.Until != nil {
		fmt.Fprintf(out, " until %s", fmtTime(*p.Until))
	}
	fmt.Fprintln(out)
	return nil
}

func runResume(c *client, args []string) error {
	var ans adminapi.ResumedAnswer
	raw, err := c.call(http.MethodDelete, "/pingback/pauses/"+url.PathEscape(args[0])+"?by=cli", nil, &ans)
	if err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	fmt.Fprintf(c.cmd.OutOrStdout(), "resumed %s (paused since %s)\n", ans.Resumed.Provider, fmtTime(ans.Resumed.Since))
	return nil
}

// flagUntil reads --until: an RFC 3339 time, or a duration from now
// (30m); "" stays "". It returns the time in RFC 3339.
func flagUntil(v string, now time.Time) (string, error) {
	if v == "" {
		return "", nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return now.Add(d).UTC().Format(time.RFC3339), nil
	}
	if _, err := time.Parse(time.RFC3339, v); err == nil {
		return v, nil
	}
	return "", fmt.Errorf("--until must be an RFC 3339 time or a duration from now, got %q", v)
}

// writePauses writes the pauses as a table (provider, since, until, by,
// reason); nothing when there are none.
func writePauses(out io.Writer, pauses []adminapi.Pause, now time.Time) error {
	if len(pauses) == 0 {
		return nil
	}
	w := newTable(out)
	fmt.Fprintln(w, "PAUSED\tSINCE\tUNTIL\tBY\tREASON")
	for _, p := range pauses {
		end := "-"
		if p.Until != nil {
			end = fmtTime(*p.Until) + " (" + until(*p.Until, now) + ")"
		}
		fmt.Fprintf(w, "%s\t%s (%s)\t%s\t%s\t%s\n", p.Provider, fmtTime(p.Since), ago(p.Since, now), end, p.By, orDash(p.Reason))
	}
	return w.Flush()
}
