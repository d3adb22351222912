//go:build unix

// Command fill puts results into a pingback store through the store's own
// insert path (Store.Insert, then the outcome update, as the handler does
// for a live pingback), so that benchmarks can run against a store that
// already holds many results, and times the scans that must not grow with
// them.
//
//	go run ./bench/fill -dir /var/tmp/pb-1m -n 1000000
//
// It stores n delivered 2captcha results (ids <prefix><counter>, a
// 2captcha-shaped POST each) plus -parked parked and -failed failed ones
// (due in a day), from -workers goroutines, then reopens the store and
// prints the time to open it, to list the parked results, to run the
// replay loop's due scan (a Claim with nothing due) and to scan every
// record (what listing parked results cost without the state index). Run it on an empty
// directory to get the same figures for a store without the n results, or
// with -n 0 -parked 0 -failed 0 -scan=false on a filled one to time its
// opens (the first upgrades a store of an earlier format).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
)

func main() {
	dir := flag.String("dir", "", "storage_dir to fill (required)")
	n := flag.Int("n", 1_000_000, "delivered results to store")
	parked := flag.Int("parked", 100, "parked results to store")
	failed := flag.Int("failed", 100, "failed results to store, due in a day")
	workers := flag.Int("workers", 64, "concurrent callers")
	scan := flag.Bool("scan", true, "end with a scan of every record (holds them all in memory)")
	prefix := flag.String("prefix", strconv.FormatInt(time.Now().Unix(), 10), "digits that start every task id")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "-dir is required")
		os.Exit(2)
	}
	ctx := context.Background()
	t := time.Now()
	st, err := badgerstore.Open(badgerstore.Options{Dir: *dir})
	if err != nil {
		fail(err)
	}
	// A store of an earlier format is upgraded by this first open.
	fmt.Printf("first open: %s\n", time.Since(t).Round(time.Microsecond))
	start := time.Now()
	var next atomic.Int64
	total := int64(*n + *parked + *failed)
	var wg sync.WaitGroup
	for range *workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= total {
					return
				}
				state := store.StateDelivered
				switch {
				case i >= int64(*n+*parked):
					state = store.StateFailed
				case i >= int64(*n):
					state = store.StateParked
				}
				rec := record(*prefix + strconv.FormatInt(i, 10))
				if _, err := st.Insert(ctx, rec); err != nil {
					fail(err)
				}
				now := time.Now().UTC()
				if _, err := st.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
					d.State, d.Lease, d.UpdatedAt = state, store.Lease{}, now
					d.LastStatus = 200
					switch state {
					case store.StateParked:
						d.LastStatus, d.LastError, d.Failures = 503, "app answered 503", 20
					case store.StateFailed:
						d.LastStatus, d.LastError, d.Failures, d.DueAt = 503, "app answered 503", 1, now.Add(24*time.Hour)
					}
					return nil
				}); err != nil {
					fail(err)
				}
				if i > 0 && i%100_000 == 0 {
					fmt.Printf("%d stored (%.0f/s)\n", i, float64(i)/time.Since(start).Seconds())
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("stored %d results in %s (%.0f/s)\n", total, time.Since(start).Round(time.Millisecond), float64(total)/time.Since(start).Seconds())
	if err := st.Close(); err != nil {
		fail(err)
	}

	t0 := time.Now()
	st, err = badgerstore.Open(badgerstore.Options{Dir: *dir})
	if err != nil {
		fail(err)
	}
	fmt.Printf("open: %s\n", time.Since(t0).Round(time.Microsecond))
	defer st.Close()
	for range 3 { // the first of each warms the caches
		t1 := time.Now()
		recs, err := st.List(ctx, store.Filter{State: store.StateParked}, 1000)
		if err != nil {
			fail(err)
		}
		listed := time.Since(t1)
		t2 := time.Now()
		claimed, err := st.Claim(ctx, store.ClaimRequest{Now: time.Now().UTC(), Limit: 16, Lease: time.Minute,
			Decide: func(d *store.Delivery, lapsed bool) { d.State = store.StateForwarding }})
		if err != nil {
			fail(err)
		}
		fmt.Printf("list parked: %d in %s; due scan (claim, nothing due): %d in %s\n",
			len(recs), listed.Round(time.Microsecond), len(claimed), time.Since(t2).Round(time.Microsecond))
	}
	if !*scan {
		return
	}
	// What listing parked results cost before the state index: a scan of
	// every record.
	t3 := time.Now()
	all, err := st.List(ctx, store.Filter{}, 1<<30)
	if err != nil {
		fail(err)
	}
	fmt.Printf("scan of every record (listing without the state index): %d in %s\n", len(all), time.Since(t3).Round(time.Millisecond))
}

// record is a live 2captcha pingback as the handler stores it.
func record(id string) *store.Record {
	now := time.Now().UTC()
	body := "id=" + id + "&code=03AGdBq24PBCbwiDRaS_MJ7Z"
	return &store.Record{
		Provider: "2captcha", ID: id, Code: "03AGdBq24PBCbwiDRaS_MJ7Z", Source: store.SourceCallback,
		ReceivedAt: now, Server: "srv0",
		Request: store.Request{
			Method: http.MethodPost, URI: "/cb", Host: "127.0.0.1:9096", Proto: "HTTP/1.1",
			RemoteAddr: "127.0.0.1:40000", LocalAddr: "127.0.0.1:9096",
			Header: http.Header{
				"Content-Type":   {"application/x-www-form-urlencoded"},
				"Content-Length": {strconv.Itoa(len(body))},
				"User-Agent":     {"Go-http-client/1.1"},
			},
			Body: []byte(body),
		},
		Delivery:  store.Delivery{State: store.StateForwarding, Attempts: 1, Lease: store.Lease{Until: now.Add(70 * time.Second)}, UpdatedAt: now},
		ExpiresAt: now.Add(24 * time.Hour),
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fill:", err)
	os.Exit(1)
}
