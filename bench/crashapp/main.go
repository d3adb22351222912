//go:build unix

// Command crashapp is the two ends of bench/crashes.sh: the app behind the
// pingback route, which records every delivery it receives, and a
// fixed-rate sender, which records the answer to every pingback it sends.
// Together they tell which results the app got twice and which answered
// 200 never reached it.
//
//	crashapp app -listen 127.0.0.1:9089 -log received.log
//	crashapp send -url http://127.0.0.1:9088/cb -rate 200 -log sent.log
//
// app answers every request 200 and appends one line per request to -log,
// "<Idempotency-Key> <X-Pingback-Source> <X-Pingback-Attempt>", written
// (one write(2), under a lock) before the answer, so a line is there for
// every request that reached the app, whether or not Caddy lived to see
// the answer. It runs until SIGINT or SIGTERM.
//
// send is an open loop like bench/loadgen: request i is due at start +
// i/rate, up to -conns in flight, each a form POST id=<prefix><i>&code=...,
// a new task id each time. It runs until -duration has passed (0: until
// SIGINT or SIGTERM), then waits for the requests in flight and appends
// one line per request to -log, "<id> <status>" (status 0: no answer, the
// connection refused or cut), and prints one line:
//
//	RESULT requests=N ok=N non2xx=N errors=N late_ms=N
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddy-pingback/pingback/bench/internal/sender"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "app":
		err = app(os.Args[2:])
	case "send":
		err = send(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashapp:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: crashapp app -listen ADDR -log FILE | crashapp send -url URL -rate N -log FILE")
	os.Exit(2)
}

// app serves the stand-in app until SIGINT or SIGTERM.
func app(args []string) error {
	fs := flag.NewFlagSet("app", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:9089", "address to listen on")
	logPath := fs.String("log", "", "file the deliveries are appended to (required)")
	_ = fs.Parse(args)
	if *logPath == "" {
		return errors.New("app: -log is required")
	}
	f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		line := fmt.Sprintf("%s %s %s\n", field(r.Header.Get("Idempotency-Key")),
			field(r.Header.Get("X-Pingback-Source")), field(r.Header.Get("X-Pingback-Attempt")))
		mu.Lock()
		_, werr := f.WriteString(line)
		mu.Unlock()
		if werr != nil {
			http.Error(w, "app: "+werr.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// field is s, or "-" when it is empty, so every log line has three fields.
func field(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// send runs the fixed-rate sender.
func send(args []string) error {
	fs := flag.NewFlagSet("send", flag.ExitOnError)
	url := fs.String("url", "http://127.0.0.1:9088/cb", "target URL")
	rate := fs.Float64("rate", 200, "requests per second")
	duration := fs.Duration("duration", 0, "how long to send (0: until SIGINT or SIGTERM)")
	conns := fs.Int("conns", 32, "most requests in flight (connections)")
	timeout := fs.Duration("timeout", 10*time.Second, "a request's time limit")
	prefix := fs.String("prefix", strconv.FormatInt(time.Now().UnixMilli(), 10), "digits that start every task id")
	logPath := fs.String("log", "", "file the answers are appended to (required)")
	_ = fs.Parse(args)
	if *logPath == "" {
		return errors.New("send: -log is required")
	}
	if *rate <= 0 || *conns <= 0 {
		return errors.New("send: rate and conns must be positive")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}

	client := sender.Client(*conns, 2*time.Second, *timeout)

	type answer struct {
		id     string
		status int
	}
	var (
		mu      sync.Mutex
		answers []answer
		ok      atomic.Int64
		non2xx  atomic.Int64
		errs    atomic.Int64
	)
	due := make(chan int, *conns)
	var wg sync.WaitGroup
	for range *conns {
		wg.Go(func() {
			var body bytes.Buffer
			for i := range due {
				id := fmt.Sprintf("%s%010d", *prefix, i)
				// Not bound to ctx: a request sent runs to its answer
				// after the sender is told to stop.
				status, err := sender.Post(client, *url, &body, *prefix, i, "03AGdBq24PBCbwiDRaS_MJ7Z")
				if err != nil { // a cut body is no answer
					status = 0
				}
				switch {
				case status == 0:
					errs.Add(1)
				case status/100 == 2:
					ok.Add(1)
				default:
					non2xx.Add(1)
				}
				mu.Lock()
				answers = append(answers, answer{id, status})
				mu.Unlock()
			}
		})
	}
	interval := float64(time.Second) / *rate
	start := time.Now()
	var late time.Duration
	n := 0
loop:
	for ; ; n++ {
		at := start.Add(time.Duration(float64(n) * interval))
		if d := time.Until(at); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				break loop
			}
		} else {
			late = max(late, -d)
		}
		select {
		case due <- n:
		case <-ctx.Done():
			break loop
		}
	}
	close(due)
	wg.Wait()

	f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, a := range answers {
		fmt.Fprintf(w, "%s %d\n", a.id, a.status)
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("RESULT requests=%d ok=%d non2xx=%d errors=%d late_ms=%d\n",
		len(answers), ok.Load(), non2xx.Load(), errs.Load(), late.Milliseconds())
	return nil
}
