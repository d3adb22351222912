package cli

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// recordsCommand is `caddy pingback records`.
func recordsCommand() *cobra.Command {
	cmd := adminCommand(&cobra.Command{
		Use:   "records [--state <state>] [--provider <name>] [--since <time>] [--limit <n>]",
		Short: "Lists stored results (the dead-letter queue: --state failed, rejected or parked)",
		Args:  cobra.NoArgs,
	}, runRecords)
	cmd.Flags().String("state", "", "Only results in this state (queued, forwarding, delivered, failed, rejected, parked, quarantined, expired)")
	cmd.Flags().String("provider", "", "Only this provider's results")
	cmd.Flags().String("since", "", "Only results received after this (RFC 3339, or a duration ago such as 2h)")
	cmd.Flags().Int("limit", 100, "At most this many results (read page by page)")
	return cmd
}

// showCommand is `caddy pingback show`.
func showCommand() *cobra.Command {
	return adminCommand(&cobra.Command{
		Use:   "show <provider> <id>",
		Short: "Shows one stored result and its delivery",
		Args:  cobra.ExactArgs(2),
	}, runShow)
}

func runRecords(c *client, _ []string) error {
	q := listQuery(c.cmd)
	since, _ := c.cmd.Flags().GetString("since")
	after, err := flagTime("since", since)
	if err != nil {
		return err
	}
	if after != "" {
		q.Set("received_after", after)
	}
	limit, err := listLimit(c.cmd)
	if err != nil {
		return err
	}
	var all adminapi.RecordsPage
	all.Records, all.NextCursor, err = readPages(c, "/pingback/records", q, limit,
		func(p *adminapi.RecordsPage) ([]*store.Record, string) { return p.Records, p.NextCursor })
	if err != nil {
		return err
	}
	if c.json {
		return c.printValue(all)
	}
	w := c.table()
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

func runShow(c *client, args []string) error {
	return recordAnswer(c, http.MethodGet, recordPath(args[0], args[1]), true)
}

// recordPath is the admin API path of one stored result.
func recordPath(provider, id string) string {
	return "/pingback/records/" + url.PathEscape(provider) + "/" + url.PathEscape(id)
}

// recordAnswer calls method on uri, an admin route that answers one
// record (show, replay, release), and prints the record: as the admin
// API's JSON with --json, else its fields, then its history if history is
// set.
func recordAnswer(c *client, method, uri string, history bool) error {
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
func printHistory(c *client, h []store.Attempt) error {
	out := c.cmd.OutOrStdout()
	if len(h) == 0 {
		_, err := fmt.Fprintln(out, "history:      -")
		return err
	}
	fmt.Fprintln(out, "history:")
	w := c.table()
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
func printRecord(c *client, r *store.Record) {
	w := c.table()
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
	// What the admin API says only when it holds (held by a pause,
	// expired for max_age, payload erased by keep_payload).
	for _, kv := range [][2]string{
		{"held", yesIf(r.Held, "yes: its provider is paused")},
		{"expired", r.ExpiredReason},
		{"payload", yesIf(r.PayloadErased, "erased (keep_payload): key, state, times and attempts kept")},
	} {
		if kv[1] != "" {
			fmt.Fprintf(w, "%s:\t%s\n", kv[0], kv[1])
		}
	}
	_ = w.Flush()
}

// yesIf is s when b holds, else "".
func yesIf(b bool, s string) string {
	if b {
		return s
	}
	return ""
}
