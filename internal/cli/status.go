package cli

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// statusCommand is `caddy pingback status`.
func statusCommand() *cobra.Command {
	return adminCommand(&cobra.Command{
		Use:   "status",
		Short: "Shows stored results by state, pending tasks, the loops and the store",
		Long: `
Shows the overview of GET /pingback/status: per provider the stored results
by delivery state, the tracked tasks still pending and the age of the
oldest, and when the last live pingback was stored; then when the replay
and poll loops last ran, and the store.`,
		Args: cobra.NoArgs,
	}, runStatus)
}

func runStatus(c *client, _ []string) error {
	var s adminapi.StatusAnswer
	raw, err := c.call(http.MethodGet, "/pingback/status", nil, &s)
	if err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	out := c.cmd.OutOrStdout()
	w := c.table()
	fmt.Fprintln(w, "PROVIDER\tSTORED\tDELIVERED\tFAILED\tREJECTED\tPARKED\tPENDING TASKS\tOLDEST PENDING\tLAST PINGBACK")
	now := time.Now()
	var provs []string
	for p := range s.Records {
		provs = append(provs, p)
	}
	for p := range s.Tasks {
		if !slices.Contains(provs, p) {
			provs = append(provs, p)
		}
	}
	slices.Sort(provs)
	for _, p := range provs {
		r := s.Records[p]
		var total int64
		for _, n := range r {
			total += n
		}
		oldest := "-"
		if age := s.Tasks[p].OldestPendingAgeSeconds; age > 0 {
			oldest = (time.Duration(age * float64(time.Second))).Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", p, total, r[store.StateDelivered], r[store.StateFailed],
			r[store.StateRejected], r[store.StateParked], s.Tasks[p].Pending, oldest, ago(s.LastCallbackAt[p], now))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, loop := range []string{"replay", "poll"} {
		fmt.Fprintf(out, "loop %s: last run %s\n", loop, ago(s.Loops[loop].LastRunAt, now))
	}
	avail := "available"
	if !s.Store.Available {
		avail = "UNAVAILABLE"
	}
	fmt.Fprintf(out, "store: %s %s, %s\n", s.Store.Kind, s.Store.Location, avail)
	return nil
}
