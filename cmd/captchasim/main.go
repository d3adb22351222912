// Command captchasim serves a simulated captcha-solving provider speaking
// the legacy 2captcha/rucaptcha/CaptchaAI in.php/res.php protocol and the
// JSON createTask/getTaskResult API (anti-captcha, CapMonster, CapSolver,
// 2captcha API v2), with pingbacks and callbacks and fault injection, so a
// pingback receiver and its fallback poller can be rehearsed against
// outages. See package
// github.com/caddy-pingback/pingback/internal/captchasim for the protocol
// details.
//
// Usage:
//
//	captchasim -listen 127.0.0.1:8910 -solve-min 5s -solve-max 20s -drop 0.1 -dup 0.05
//
// It serves /in.php, /res.php, /createTask, /getTaskResult, /getBalance and
// /stats until SIGINT or SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "captchasim:", err)
		os.Exit(1)
	}
}

// run parses args, serves until a signal arrives and shuts down.
func run(args []string) error {
	fs := flag.NewFlagSet("captchasim", flag.ContinueOnError)
	var (
		cfg      captchasim.Config
		listen   string
		logLevel string
	)
	fs.StringVar(&listen, "listen", "127.0.0.1:8910", "address to listen on")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.Key, "key", captchasim.DefaultKey, "API key clients must send as key=")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "random seed (same seed and request order give the same ids, answers and faults)")
	fs.DurationVar(&cfg.SolveMin, "solve-min", 5*time.Second, "minimum solve delay after submission")
	fs.DurationVar(&cfg.SolveMax, "solve-max", 20*time.Second, "maximum solve delay after submission")
	fs.Float64Var(&cfg.UnsolvableRate, "unsolvable", 0, "probability a task ends ERROR_CAPTCHA_UNSOLVABLE")
	fs.BoolVar(&cfg.NumericJSONIDs, "numeric-json-ids", false, "answer json=1 userrecaptcha submits with a numeric id (CaptchaAI quirk)")
	fs.StringVar(&cfg.PingbackMethod, "pingback-method", "POST", "pingback HTTP method: POST (form id=&code=) or GET (?id=&code=)")
	fs.DurationVar(&cfg.PingbackTimeout, "pingback-timeout", captchasim.DefaultPingbackTimeout, "timeout of one pingback call")
	fs.Float64Var(&cfg.DropRate, "drop", 0, "probability a task's pingback is never sent")
	fs.Float64Var(&cfg.DuplicateRate, "dup", 0, "probability a task's pingback is sent twice")
	fs.Float64Var(&cfg.LateRate, "late", 0, "probability a task's pingback is sent late")
	fs.DurationVar(&cfg.LateDelay, "late-delay", captchasim.DefaultLateDelay, "how late a late pingback is sent, after solving")
	fs.DurationVar(&cfg.ForgetAfter, "forget-after", captchasim.DefaultForgetAfter, "how long after submission a task stays retrievable (negative: forever)")
	fs.StringVar(&cfg.Price, "price", captchasim.DefaultPrice, "price reported by res.php action=get2")
	fs.StringVar(&cfg.Balance, "balance", captchasim.DefaultBalance, "balance reported by res.php action=getbalance")
	fs.Float64Var(&cfg.ServerErrorRate, "5xx", 0, "probability a res.php request gets an HTML 500/502/503 page")
	fs.Float64Var(&cfg.NoSlotRate, "noslot", 0, "probability a res.php request gets ERROR_NO_SLOT_AVAILABLE")
	fs.Float64Var(&cfg.BulkMismatchRate, "bulk-mismatch", 0, "probability a bulk get answer has the wrong number of elements")
	fs.Float64Var(&cfg.SubmitServerErrorRate, "submit-5xx", 0, "probability an in.php request gets an HTML 500/502/503 page")
	fs.Float64Var(&cfg.SubmitNoSlotRate, "submit-noslot", 0, "probability an in.php request gets ERROR_NO_SLOT_AVAILABLE")
	fs.BoolVar(&cfg.EnforceBudget, "budget", false, "enforce the res.php budget R > C*per-task + allowance (ERROR: 1005)")
	fs.IntVar(&cfg.BudgetPerTask, "budget-per-task", captchasim.DefaultBudgetPerTask, "res.php calls allowed per submitted task")
	budgetAllowance := fs.Int("budget-allowance", captchasim.DefaultBudgetAllowance, "fixed res.php allowance of the budget rule (0 allowed)")
	fs.StringVar(&cfg.JSONFlavor, "json-flavor", captchasim.FlavorAntiCaptcha, "JSON API behaviour: anticaptcha (also CapMonster), capsolver or 2captcha")
	fs.StringVar(&cfg.JSONCallback, "json-callback", "", "JSON API callback form: form or json (default: form for 2captcha, json otherwise)")
	fs.IntVar(&cfg.MaxResultCalls, "max-result-calls", 0, "answer ERROR_TOO_MUCH_REQUESTS beyond this many getTaskResult calls per task (CapMonster: 120; 0: no limit)")
	fs.DurationVar(&cfg.BudgetBlockFor, "budget-block-for", 0, "keep answering ERROR: 1005 this long once the budget bites (0: only while over budget)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("parsing -log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	// Config treats 0 as "default"; on the command line 0 means 0.
	cfg.BudgetAllowance = *budgetAllowance
	if cfg.BudgetAllowance == 0 {
		cfg.BudgetAllowance = -1
	}
	if cfg.BudgetPerTask == 0 {
		cfg.BudgetPerTask = -1
	}
	cfg.Logger = logger

	sim, err := captchasim.New(cfg)
	if err != nil {
		return err
	}
	defer sim.Close()

	eff := sim.Config()
	logger.Info("captchasim starting",
		"listen", listen, "seed", eff.Seed,
		"solve_min", eff.SolveMin, "solve_max", eff.SolveMax, "unsolvable", eff.UnsolvableRate,
		"pingback_method", eff.PingbackMethod, "drop", eff.DropRate, "dup", eff.DuplicateRate,
		"late", eff.LateRate, "late_delay", eff.LateDelay, "forget_after", eff.ForgetAfter,
		"5xx", eff.ServerErrorRate, "noslot", eff.NoSlotRate, "bulk_mismatch", eff.BulkMismatchRate,
		"submit_5xx", eff.SubmitServerErrorRate, "submit_noslot", eff.SubmitNoSlotRate,
		"budget", eff.EnforceBudget, "budget_per_task", eff.BudgetPerTask,
		"budget_allowance", eff.BudgetAllowance, "budget_block_for", eff.BudgetBlockFor,
		"numeric_json_ids", eff.NumericJSONIDs, "json_flavor", eff.JSONFlavor, "json_callback", eff.JSONCallback,
		"max_result_calls", eff.MaxResultCalls)

	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	srv := &http.Server{
		Handler:           sim,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	logger.Info("serving", "in", "http://"+addr+"/in.php", "res", "http://"+addr+"/res.php",
		"json_api", "http://"+addr+" (createTask, getTaskResult, getBalance)", "stats", "http://"+addr+"/stats")

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Warn("shutdown", "error", err)
	}
	sim.Close()
	st := sim.Stats()
	logger.Info("final stats",
		"submits", st.Submits, "res_calls", st.ResCalls, "get_task_result_calls", st.GetTaskResultCalls, "solved", st.TasksSolved,
		"unsolvable", st.TasksUnsolvable, "pingbacks_sent", st.PingbacksSent,
		"pingbacks_failed", st.PingbacksFailed, "pingbacks_dropped", st.PingbacksDropped,
		"server_errors", st.ServerErrors, "budget_blocks", st.BudgetBlocks)
	return nil
}
