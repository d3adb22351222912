package pingback

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

func init() {
	addSubcommand(func() *cobra.Command {
		cmd := &cobra.Command{
			Use:   "records [--state <state>] [--provider <name>] [--since <time>] [--limit <n>]",
			Short: "Lists stored results (the dead-letter queue: --state failed, rejected or parked)",
			Args:  cobra.NoArgs,
			RunE:  cliRun(cliRecords),
		}
		cmd.Flags().String("state", "", "Only results in this state (queued, forwarding, delivered, failed, rejected, parked, quarantined)")
		cmd.Flags().String("provider", "", "Only this provider's results")
		cmd.Flags().String("since", "", "Only results received after this (RFC 3339, or a duration ago such as 2h)")
		cmd.Flags().Int("limit", 100, "At most this many results (read page by page)")
		adminFlags(cmd)
		return cmd
	})
	addSubcommand(func() *cobra.Command {
		cmd := &cobra.Command{
			Use:   "show <provider> <id>",
			Short: "Shows one stored result and its delivery",
			Args:  cobra.ExactArgs(2),
		}
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			return cliRun(func(c *cliClient) error { return cliShow(c, args[0], args[1]) })(cmd, args)
		}
		adminFlags(cmd)
		return cmd
	})
}

func cliRecords(c *cliClient) error {
	fs := c.cmd.Flags()
	q := url.Values{}
	if v, _ := fs.GetString("state"); v != "" {
		q.Set("state", v)
	}
	if v, _ := fs.GetString("provider"); v != "" {
		q.Set("provider", v)
	}
	since, _ := fs.GetString("since")
	after, err := flagTime("since", since)
	if err != nil {
		return err
	}
	if after != "" {
		q.Set("received_after", after)
	}
	limit, _ := fs.GetInt("limit")
	if limit < 1 {
		return fmt.Errorf("--limit must be at least 1, got %d", limit)
	}
	// Page through the cursor until limit records or the last page.
	var all adminapi.RecordsPage
	all.Records = []*store.Record{}
	for {
		q.Set("limit", strconv.Itoa(min(limit-len(all.Records), 1000)))
		var page adminapi.RecordsPage
		if _, err := c.call(http.MethodGet, "/pingback/records?"+q.Encode(), nil, &page); err != nil {
			return err
		}
		all.Records = append(all.Records, page.Records...)
		all.NextCursor = page.NextCursor
		if page.NextCursor == "" || len(all.Records) >= limit {
			break
		}
		q.Set("cursor", page.NextCursor)
	}
	if c.json {
		raw, err := json.Marshal(all)
		if err != nil {
			return err
		}
		c.printJSON(raw)
		return nil
	}
	w := tabwriter.NewWriter(c.cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "PROVIDER\tID\tSTATE\tATTEMPTS\tRECEIVED\tLAST ERROR")
	for _, r := range all.Records {
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", r.Provider, r.ID, r.State, r.Attempts,
			r.ReceivedAt.UTC().Format(time.RFC3339), orDash(r.LastError))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if all.NextCursor != "" {
		fmt.Fprintf(c.cmd.OutOrStdout(), "(more than %d: raise --limit to see them)\n", limit)
	}
	return nil
}

func cliShow(c *cliClient, provider, id string) error {
	return cliRecordAnswer(c, http.MethodGet, recordPath(provider, id), true)
}

// recordPath is the admin API path of one stored result.
func recordPath(provider, id string) string {
	return "/pingback/records/" + url.PathEscape(provider) + "/" + url.PathEscape(id)
}

// cliRecordAnswer calls method on uri, an admin route that answers one
// record (show, replay, release), and prints the record: as the admin
// API's JSON with --json, else its fields, then its history if history is
// set.
func cliRecordAnswer(c *cliClient, method, uri string, history bool) error {
	var r store.Record
	raw, err := c.call(method, uri, nil, &r)
	if err != nil {
		return err
	}
	if c.json {
		c.printJSON(raw)
		return nil
	}
	printRecord(c, &r)
	if !history {
		return nil
	}
	return printHistory(c, r.History)
}

// printHistory prints a record's attempts, oldest first.
func printHistory(c *cliClient, h []store.Attempt) error {
	out := c.cmd.OutOrStdout()
	if len(h) == 0 {
		_, err := fmt.Fprintln(out, "history:      -")
		return err
	}
	fmt.Fprintln(out, "history:")
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "  ATTEMPT\tSOURCE\tSTARTED\tTOOK\tSTATUS\tOUTCOME\tERROR")
	for _, a := range h {
		took, outcome, status := "-", "running", "-"
		if !a.EndedAt.IsZero() {
			took, outcome = a.EndedAt.Sub(a.StartedAt).Round(time.Millisecond).String(), a.Outcome
		}
		if a.Status != 0 {
			status = strconv.Itoa(a.Status)
		}
		fmt.Fprintf(w, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, a.Source, a.StartedAt.UTC().Format(time.RFC3339),
			took, status, outcome, orDash(a.Error))
	}
	return w.Flush()
}

// printRecord prints a record's key facts, one per line (never its code).
func printRecord(c *cliClient, r *store.Record) {
	w := tabwriter.NewWriter(c.cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
	status := "-"
	if r.LastStatus != 0 {
		status = strconv.Itoa(r.LastStatus)
	}
	for _, kv := range [][2]string{
		{"key", r.Key().String()},
		{"state", string(r.State)},
		{"source", string(r.Source)},
		{"verified", orDash(r.Verified)},
		{"quarantine", orDash(r.Quarantine)},
		{"received", r.ReceivedAt.UTC().Format(time.RFC3339)},
		{"attempts", strconv.Itoa(r.Attempts)},
		{"failures", strconv.Itoa(r.Failures)},
		{"last status", status},
		{"last error", orDash(r.LastError)},
		{"updated", r.UpdatedAt.UTC().Format(time.RFC3339)},
		{"expires", r.ExpiresAt.UTC().Format(time.RFC3339)},
		{"route", r.Request.Method + " " + r.Request.Host + r.Request.URI},
	} {
		fmt.Fprintf(w, "%s:\t%s\n", kv[0], kv[1])
	}
	_ = w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
