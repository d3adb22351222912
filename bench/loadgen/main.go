//go:build unix

// Command loadgen sends pingback-shaped POSTs at a fixed rate (open loop)
// and reports latency percentiles timed from each request's intended send
// time, so that a stall of the server delays the requests scheduled during
// it and shows in the figures (wrk, closed-loop, would send fewer requests
// instead).
//
//	go run ./bench/loadgen -url http://127.0.0.1:9096/cb -rate 1000 -duration 10s
//
// Request i is due at start + i/rate. Up to -conns requests are in flight
// at once, each on its own keep-alive connection; a request whose
// connection is busy waits, and that wait counts in its latency. Every
// request is a form POST id=<prefix><counter>&code=<token>, a new task id
// each time. It prints one line:
//
//	RESULT requests=N duration_us=D p50_us= p90_us= p99_us= p999_us= max_us= non2xx= errors= late_ms= cpu_us_per_req=
//
// late_ms is how far behind schedule the last request was sent (a
// generator that cannot keep up shows here), cpu_us_per_req the
// generator's own CPU time (user and system) per request.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/caddy-pingback/pingback/bench/internal/sender"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:9096/cb", "target URL")
	rate := flag.Float64("rate", 1000, "requests per second")
	duration := flag.Duration("duration", 10*time.Second, "how long to send")
	conns := flag.Int("conns", 64, "most requests in flight (connections)")
	prefix := flag.String("prefix", strconv.FormatInt(time.Now().UnixMilli(), 10), "digits that start every task id")
	code := flag.String("code", "03AGdBq24PBCbwiDRaS_MJ7Z", "the code field")
	flag.Parse()
	if *rate <= 0 || *conns <= 0 {
		fmt.Fprintln(os.Stderr, "rate and conns must be positive")
		os.Exit(2)
	}

	client := sender.Client(*conns, 5*time.Second, 30*time.Second)

	n := int(*rate * duration.Seconds())
	interval := float64(time.Second) / *rate
	lat := make([]time.Duration, n)
	var non2xx, errs atomic.Int64
	due := make(chan int, n)
	var wg sync.WaitGroup
	cpu0 := cpuTime()
	start := time.Now().Add(50 * time.Millisecond)
	for range *conns {
		wg.Go(func() {
			var body bytes.Buffer
			for i := range due {
				at := start.Add(time.Duration(float64(i) * interval))
				switch status, _ := sender.Post(client, *url, &body, *prefix, i, *code); {
				case status == 0:
					errs.Add(1)
				case status/100 != 2:
					non2xx.Add(1)
				}
				lat[i] = time.Since(at)
			}
		})
	}
	var late time.Duration
	for i := range n {
		at := start.Add(time.Duration(float64(i) * interval))
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		} else {
			late = -d
		}
		due <- i
	}
	close(due)
	wg.Wait()
	elapsed := time.Since(start)
	cpu := cpuTime() - cpu0

	slices.Sort(lat)
	pct := func(p float64) int64 {
		if n == 0 {
			return 0
		}
		return lat[min(n-1, int(p*float64(n)))].Microseconds()
	}
	fmt.Printf("RESULT requests=%d duration_us=%d p50_us=%d p90_us=%d p99_us=%d p999_us=%d max_us=%d non2xx=%d errors=%d late_ms=%d cpu_us_per_req=%.1f\n",
		n, elapsed.Microseconds(), pct(0.50), pct(0.90), pct(0.99), pct(0.999), pct(1), non2xx.Load(), errs.Load(),
		late.Milliseconds(), float64(cpu.Microseconds())/float64(max(n, 1)))
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
