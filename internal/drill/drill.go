// Package drill is `caddy pingback drill`: it rehearses failures on a
// sandboxed copy of a config. It adapts the config to JSON, rewrites it
// (free loopback ports, a temporary Badger store, the providers' endpoints
// at a built-in simulator, the app upstreams at a stand-in the drill
// controls, timers scaled down), runs it in a child Caddy (the same binary,
// `caddy run`) and plays the scenarios against it over HTTP and the admin
// API, then reports one row per scenario.
//
// The package imports no part of the plugin's core: the root package
// registers the command (Command) and passes in the plugin's defaults
// (Defaults); the child Caddy learns the timer scale from ScaleEnv.
package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// Defaults are the plugin's config defaults and fixed bounds the drill
// reads a config against: what a field the config leaves out means, and
// the values it sets in the sandbox. The root package fills them in from
// its own constants, which stay the one definition.
type Defaults struct {
	// AckTimeout is a pingback handler's ack_timeout when the config
	// sets none (anticaptcha and capmonster routes use 1s).
	AckTimeout time.Duration
	// BackoffMin and BackoffMax are the replay block's backoff_min and
	// backoff_max when unset.
	BackoffMin, BackoffMax time.Duration
	// PollInterval and GiveUp are the poll block's interval and give_up
	// when unset.
	PollInterval, GiveUp time.Duration
	// AutoAfterMin and AutoAfterMax bound the poll delay `after auto`
	// picks; AutoAfterMax is also the first poll's delay when the config
	// sets no after.
	AutoAfterMin, AutoAfterMax time.Duration
	// VerifyToken and VerifyNone are the handler's verify values: the
	// mode a route defaults to when its provider has a pingback_track
	// ("token"), and the one that checks nothing ("none").
	VerifyToken, VerifyNone string
	// UnknownAccept is the handler's unknown_ids value that accepts a
	// pingback for an id no submission registered ("accept").
	UnknownAccept string
}

// ScaleEnv is the environment variable through which the drill tells the
// child Caddy it starts that the config's timers were scaled down by this
// factor (a decimal number in (0, 1)). Only that child honours it: the
// root package reads it to lower its validated minimums and fixed timers by
// the same factor, so a scaled config still validates.
const ScaleEnv = "PINGBACK_INTERNAL_DRILL_TIMER_SCALE"

// Scaled is d scaled by scale (in (0, 1]; 1 and above leave d as it is),
// never below floor nor above d: how the drill's child scales the plugin's
// fixed timers, and how the drill predicts them.
func Scaled(scale float64, d, floor time.Duration) time.Duration {
	if scale >= 1 {
		return d
	}
	return min(d, max(time.Duration(float64(d)*scale), floor))
}

// drillFlags are the flags of `caddy pingback drill`.
type drillFlags struct {
	config, adapter, address string
	json, app, realTimers    bool
	measure                  bool
	samples                  int
	timeout                  time.Duration
	standinDrop              bool // hidden: a stand-in app that drops every request (the drill's own tests)
	defaults                 Defaults
}

// Command builds `caddy pingback drill`, which reads configs against
// defaults. It exits the process with status 1 when a scenario failed and
// 2 when the config cannot be rehearsed.
func Command(defaults Defaults) *cobra.Command {
	f := drillFlags{defaults: defaults}
	cmd := &cobra.Command{
		Use:   "drill --config <file> [--adapter caddyfile] [--json] [--app] [--real-timers] [--measure-provider [--address <admin>]]",
		Short: "Rehearses failures on a sandboxed copy of a config",
		Long: `
Runs the config in a sandbox (a child Caddy on free loopback ports, a
temporary Badger store, the providers' endpoints at a built-in simulator,
the app upstreams of every pingback route replaced by a stand-in app the
drill controls) and rehearses, for every pingback route and polled
provider: the same pingback twice and 20 times at once, the app down and
answering 503, a slow app, every pingback dropped, Caddy killed with
SIGKILL, the provider's result endpoint answering HTML 5xx, and a
pingback racing a poll. Timers are scaled down unless --real-timers.

Exit status: 0 when every scenario passed, 1 when one failed, 2 when the
config cannot be rehearsed.

--measure-provider times the balance request to each configured provider
endpoint (this reaches the real provider) and, with --address, reads the
pingback delays of a running instance's tracked tasks.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			code := runDrill(cmd.Context(), f, os.Stdout, os.Stderr)
			if code != 0 {
				os.Exit(code)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.config, "config", "c", "", "the config file to rehearse (required)")
	fl.StringVarP(&f.adapter, "adapter", "a", "", "config adapter (default: json for *.json, else caddyfile)")
	fl.BoolVar(&f.json, "json", false, "print the report as one JSON object on stdout")
	fl.BoolVar(&f.app, "app", false, "keep the real app upstreams; every drill delivery carries X-Pingback-Drill: 1")
	fl.BoolVar(&f.realTimers, "real-timers", false, "keep the config's timers (the drill then takes longer)")
	fl.BoolVar(&f.measure, "measure-provider", false, "time the balance request to each configured provider (reaches the real provider)")
	fl.StringVar(&f.address, "address", "", "admin address of a running instance, for --measure-provider's pingback delays")
	fl.IntVar(&f.samples, "samples", 10, "balance requests per provider endpoint for --measure-provider")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "the longest the drill may take; then every process it started is ended")
	fl.BoolVar(&f.standinDrop, "standin-drop", false, "")
	_ = fl.MarkHidden("standin-drop")
	return cmd
}

// drillReport is the --json output (pinned shape).
type drillReport struct {
	Config       string        `json:"config"`
	ScaledTimers bool          `json:"scaled_timers"`
	Seconds      float64       `json:"seconds"`
	Passed       bool          `json:"passed"`
	Scenarios    []drillResult `json:"scenarios"`
	Notes        []string      `json:"notes,omitempty"`
	Measure      *drillMeasure `json:"measure_provider,omitempty"`
}

// runDrill runs the drill and returns the exit status.
func runDrill(parent context.Context, f drillFlags, stdout, stderr io.Writer) int {
	if parent == nil {
		parent = context.Background()
	}
	started := time.Now()
	fail := func(err error) int {
		if f.json {
			_ = json.NewEncoder(stdout).Encode(map[string]string{"error": err.Error()})
		} else {
			fmt.Fprintln(stderr, "drill:", err)
		}
		return 2
	}
	if f.config == "" {
		return fail(errors.New("--config is required: the config file to rehearse"))
	}
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	cfg, err := adaptConfig(f.config, f.adapter)
	if err != nil {
		return fail(err)
	}
	var measure *drillMeasure
	if f.measure {
		measure = measureProviders(ctx, cfg, f.samples, f.address, f.defaults, stderr)
	}
	app, err := newStandin(f.standinDrop)
	if err != nil {
		return fail(err)
	}
	defer app.close()
	sims := map[string]*drillSim{}
	defer func() {
		for _, s := range sims {
			s.close()
		}
	}()
	var simErr error
	simURL := func(provider string) string {
		s := sims[provider]
		if s == nil {
			if s, err = newDrillSim(provider); err != nil {
				simErr = err
				return "http://127.0.0.1:1"
			}
			sims[provider] = s
		}
		return s.url
	}
	sb, err := newSandbox(f.config, cfg, drillOptions{realTimers: f.realTimers, app: f.app, defaults: f.defaults}, app.addr, simURL)
	if err == nil && simErr != nil {
		err = simErr
	}
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(sb.Dir)
	if err := app.forwardTo(sb.Upstreams); err != nil {
		return fail(err)
	}
	if f.app {
		sb.Notes = append(sb.Notes, "--app: deliveries go to the app's own upstreams (through the drill, which injects the faults), each with X-Pingback-Drill: 1")
	}
	// Every polled provider needs its simulator even without an endpoint
	// in a route (the poller's endpoints were set above).
	for _, p := range sb.Polled {
		simURL(p.Provider)
	}
	for _, n := range sb.Notes {
		fmt.Fprintln(stderr, "drill:", n)
	}
	child := &drillChild{sb: sb}
	defer child.stop()
	fmt.Fprintf(stderr, "drill: starting the sandbox Caddy (%d pingback routes, %d polled providers, store in %s)\n",
		len(sb.Routes), len(sb.Polled), filepath.Join(sb.Dir, "store"))
	if err := child.start(ctx); err != nil {
		return fail(fmt.Errorf("the config cannot run in the sandbox: %w", err))
	}
	total := len(sb.Routes) * 6
	for _, p := range sb.Polled {
		total += len(p.scenarios())
	}
	n := 0
	run := &drillRun{ctx: ctx, sb: sb, child: child, app: app, sims: sims, broken: map[*drillRoute]string{},
		client: &http.Client{Timeout: 30 * time.Second},
		progress: func(r drillResult) {
			n++
			where := r.Route
			if where == "" {
				where = r.Provider
			}
			line := fmt.Sprintf("drill: [%d/%d] %-20s %-32s %s (%.3fs)", n, total, r.ID, where, r.Verdict, r.Seconds)
			if r.Verdict != "pass" {
				line += ": expected " + r.Expected + "; seen " + r.Seen
			}
			fmt.Fprintln(stderr, line)
		}}
	for _, r := range sb.Routes {
		run.routeScenarios(r)
	}
	for _, p := range sb.Polled {
		run.providerScenarios(p)
	}
	err = run.sigkill()
	if ctx.Err() != nil {
		return fail(fmt.Errorf("drill stopped (%v); every process it started was ended", context.Cause(ctx)))
	}
	if err != nil {
		return fail(err)
	}
	rep := drillReport{Config: f.config, ScaledTimers: sb.Scale < 1, Seconds: secs(time.Since(started)),
		Passed: true, Scenarios: run.results, Notes: sb.Notes, Measure: measure}
	for _, r := range run.results {
		if r.Verdict != "pass" {
			rep.Passed = false
		}
	}
	if f.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		printDrillTable(stdout, rep)
	}
	if !rep.Passed {
		return 1
	}
	return 0
}

// printDrillTable prints the report as a table.
func printDrillTable(w io.Writer, rep drillReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tROUTE\tPROVIDER\tVERDICT\tSECONDS\tMEASURES")
	for _, r := range rep.Scenarios {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.3f\t%s\n", r.ID, r.Route, r.Provider, r.Verdict, r.Seconds, r.Measures)
	}
	_ = tw.Flush()
	for _, r := range rep.Scenarios {
		if r.Verdict != "pass" {
			fmt.Fprintf(w, "\nFAIL %s %s %s\n  expected: %s\n  seen:     %s\n", r.ID, r.Route, r.Provider, r.Expected, r.Seen)
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	if rep.Measure != nil {
		printMeasure(w, rep.Measure)
	}
	verdict := "PASSED"
	if !rep.Passed {
		verdict = "FAILED"
	}
	scaled := "real timers"
	if rep.ScaledTimers {
		scaled = "timers scaled down"
	}
	fmt.Fprintf(w, "\ndrill %s: %d scenarios in %.1fs (%s) on %s\n", verdict, len(rep.Scenarios), rep.Seconds, scaled,
		strings.TrimSpace(rep.Config))
}
