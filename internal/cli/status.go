package cli

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// statusCommand is `caddy pingback status`.
func statusCommand() *cobra.Command {
	return adminCommand(&cobra.Command{
		Use:   "status",
		Short: "Shows stored results by state, pending tasks, accounts, held-back routes, the loops and the store",
		Long: `
Shows the overview of GET /pingback/status: per provider the stored results
by delivery state (quarantined ones too, and expired ones where the Caddy
has that state), the tracked tasks still pending (and how many of them
are unpollable: submitted with an API key not in the provider's api_key)
and the age of the oldest, and when the last live pingback was stored;
per provider and account (one API key, named by its account id and its
api_key entry, never the key) the poll budget used and left and the
pending and unpollable tasks, which tell when a rotated-out key can be
removed; the routes whose replays this process holds back after the app
answered 429 (or 503 with Retry-After), if any: until when they are
paused and how many replays of each may be in flight, of the replay
concurrency; the pauses of deliveries (caddy pingback pause), if any; then
when the replay and poll loops last ran, and the store.`,
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
	return writeStatus(c.cmd.OutOrStdout(), s, time.Now())
}

// writeStatus writes s as `caddy pingback status` shows it, the ages and
// the times to come counted from now.
func writeStatus(out io.Writer, s adminapi.StatusAnswer, now time.Time) error {
	w := newTable(out)
	expired := carriesExpired(s.Records)
	head := "PROVIDER\tSTORED\tDELIVERED\tFAILED\tREJECTED\tPARKED\tQUARANTINED\t"
	if expired {
		head += "EXPIRED\t"
	}
	fmt.Fprintln(w, head+"PENDING TASKS\tUNPOLLABLE\tOLDEST PENDING\tLAST PINGBACK")
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
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t", p, total, r[store.StateDelivered], r[store.StateFailed],
			r[store.StateRejected], r[store.StateParked], r[store.StateQuarantined])
		if expired {
			fmt.Fprintf(w, "%d\t", r[stateExpired])
		}
		fmt.Fprintf(w, "%d\t%d\t%s\t%s\n", s.Tasks[p].Pending, s.Tasks[p].Unpollable, oldest, ago(s.LastCallbackAt[p], now))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if err := writeAccounts(out, s.Accounts); err != nil {
		return err
	}
	if err := writeRoutes(out, s.Routes, now); err != nil {
		return err
	}
	if err := writePauses(out, s.Pauses, now); err != nil {
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

// stateExpired is the state of a result kept but never forwarded
// because it grew too old (a provider's max_age); a Caddy whose status
// counts it has an EXPIRED column.
const stateExpired store.State = "expired"

// carriesExpired reports whether the status counts expired results (a
// Caddy that has the state lists it for every provider, 0 included).
func carriesExpired(records map[string]map[store.State]int64) bool {
	for _, byState := range records {
		if _, ok := byState[stateExpired]; ok {
			return true
		}
	}
	return false
}

// noKey is what the accounts table shows as the api_key entry of an
// account this Caddy has no key for (its tasks are unpollable).
const noKey = "(not in api_key)"

// writeAccounts writes the accounts as a table sorted by provider, then
// account id: the api_key entry each is (its placeholder or position;
// noKey for an account with pending tasks but no configured key), its
// poll budget used and left, and its pending and unpollable tasks. It
// writes nothing when there are none (or the Caddy is older than
// accounts).
func writeAccounts(out io.Writer, accounts map[string]map[string]adminapi.AccountStatus) error {
	type row struct{ provider, id string }
	var rows []row
	for p, m := range accounts {
		for id := range m {
			rows = append(rows, row{p, id})
		}
	}
	if len(rows) == 0 {
		return nil
	}
	slices.SortFunc(rows, func(a, b row) int {
		if c := strings.Compare(a.provider, b.provider); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	w := newTable(out)
	fmt.Fprintln(w, "PROVIDER\tACCOUNT\tAPI_KEY ENTRY\tUSED\tLEFT\tPENDING\tUNPOLLABLE")
	for _, r := range rows {
		a := accounts[r.provider][r.id]
		key := a.APIKeyEntry
		if key == "" {
			key = noKey
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%d\n", r.provider, r.id, key, a.Used, a.Left, a.Pending, a.Unpollable)
	}
	return w.Flush()
}

// writeRoutes writes the held-back routes as a table sorted by route: the
// time their replays resume ("-" when not paused) and their replay
// concurrency, "n of max". It writes nothing when there are none.
func writeRoutes(out io.Writer, routes map[string]adminapi.RouteStatus, now time.Time) error {
	if len(routes) == 0 {
		return nil
	}
	names := make([]string, 0, len(routes))
	for r := range routes {
		names = append(names, r)
	}
	slices.Sort(names)
	w := newTable(out)
	fmt.Fprintln(w, "ROUTE\tPAUSED UNTIL\tREPLAY CONCURRENCY")
	for _, name := range names {
		r := routes[name]
		paused := "-"
		if r.PausedUntil != nil {
			paused = fmtTime(*r.PausedUntil) + " (" + until(*r.PausedUntil, now) + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%d of %d\n", name, paused, r.Concurrency, r.Max)
	}
	return w.Flush()
}
