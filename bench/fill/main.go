//go:build unix

// Command fill puts results into a pingback store through the store's own
// insert path (Store.Insert, then the outcome update, as the handler does
// for a live pingback), so that benchmarks can run against a store that
// already holds a day of results, and times the scans that must not grow
// with them.
//
//	go run ./bench/fill -dir /var/tmp/pb-1m -n 1000000
//	go run ./bench/fill -postgres "$DSN" -schema bench_5m -n 5000000
//
// With -postgres it fills that PostgreSQL database instead (the store
// opened as the plugin opens it, in -schema, created if missing) through
// the same path, and times the same reads on it.
//
// It stores n delivered 2captcha results (ids <prefix><counter>, a
// 2captcha-shaped POST each) plus -parked parked and -failed failed ones
// (due in a day), from -workers goroutines. Their receipt times are spread
// evenly over the -span that ends when the fill starts, in the order of
// their ids, and each expires -retention plus -margin after its receipt: a
// store filled with the defaults holds what a day at a steady rate leaves
// (the oldest result expiring an hour after the fill started, so that none
// expires while it runs, and the others one by one over the next day). It also writes
// the history a day leaves: one minute record per minute of the span
// (HistoryStore.WriteMinute, instance "fill").
//
// Every -progress results it prints how many are stored, the rate since the
// previous line and overall. Then it reopens the store and prints the time
// to open it, to list the parked results, to run the replay loop's due scan
// (a Claim with nothing due) and, with -scan, to page through every record
// by received time (ListPage, 1,000 a page: what an operator's listing of
// the whole store costs; its memory stays that of a page). Run it on an
// empty directory to get the same figures for a store without the n
// results, or with -n 0 -parked 0 -failed 0 -history=false -scan=false on a
// filled one to time its opens (the first upgrades a store of an earlier
// format).
//
// -table-size, -table-multiplier, -compression and -block-cache open a
// Badger store with another layout of its tables than the store's own
// (badgerstore.TableOptions, for measurement only: the plugin always opens
// its own layout), for bench/tables.sh: what a layout costs in files, disk,
// open time and memory. The peak of the process's anonymous memory (its
// callers' and the store's: memtables, compactions' table builders, the
// block cache) is printed after the fill.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4/options"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
	"github.com/caddy-pingback/pingback/internal/store/pgstore"
)

// codecs are -compression's values.
var codecs = map[string]options.CompressionType{"none": options.None, "snappy": options.Snappy, "zstd": options.ZSTD}

func main() {
	dir := flag.String("dir", "", "storage_dir to fill (required without -postgres)")
	dsn := flag.String("postgres", "", "fill this PostgreSQL database (a DSN, as the plugin's dsn) instead of a storage_dir")
	schema := flag.String("schema", pgstore.DefaultSchema, "with -postgres: the schema to fill")
	n := flag.Int("n", 1_000_000, "delivered results to store")
	parked := flag.Int("parked", 100, "parked results to store")
	failed := flag.Int("failed", 100, "failed results to store, due in a day")
	workers := flag.Int("workers", 64, "concurrent callers")
	span := flag.Duration("span", 24*time.Hour, "the receipt times spread over this span, ending when the fill starts")
	retention := flag.Duration("retention", 24*time.Hour, "each result expires this long after its receipt, plus -margin")
	margin := flag.Duration("margin", time.Hour, "added to each result's retention, so that none expires while the fill runs")
	history := flag.Bool("history", true, "write a minute record of the history per minute of the span")
	progress := flag.Int("progress", 1_000_000, "print a progress line every this many results")
	scan := flag.Bool("scan", true, "end with a paged scan of every record (ListPage, 1,000 a page)")
	tableSize := flag.Int64("table-size", 0, "Badger: the tables' size at the base level, in bytes (0: the store's own, 1 MiB)")
	tableMult := flag.Int("table-multiplier", 0, "Badger: each level's tables this many times the size of the level above's (0: the store's own, 1)")
	compression := flag.String("compression", "none", "Badger: the tables' codec, none, snappy or zstd (the store's own: none)")
	blockCache := flag.Int64("block-cache", 0, "Badger: the cache of decompressed blocks, in bytes (the store's own: 0)")
	prefix := flag.String("prefix", strconv.FormatInt(time.Now().Unix(), 10), "digits that start every task id")
	flag.Parse()
	if (*dir == "") == (*dsn == "") {
		fmt.Fprintln(os.Stderr, "one of -dir and -postgres is required")
		os.Exit(2)
	}
	if *span < 0 || *margin < 0 || *retention <= 0 || *progress <= 0 || *workers <= 0 {
		fmt.Fprintln(os.Stderr, "-span and -margin must not be negative; -retention, -progress and -workers must be positive")
		os.Exit(2)
	}
	ctx := context.Background()
	var anon anonSampler
	anon.start()
	t := time.Now()
	codec, ok := codecs[*compression]
	if !ok || *tableSize < 0 || *tableMult < 0 || *blockCache < 0 {
		fmt.Fprintln(os.Stderr, "-compression must be none, snappy or zstd; -table-size, -table-multiplier and -block-cache must not be negative")
		os.Exit(2)
	}
	sc := storeConfig{dir: *dir, dsn: *dsn, schema: *schema, tables: badgerstore.TableOptions{
		Size: *tableSize, Multiplier: *tableMult, Compression: codec, BlockCache: *blockCache}}
	fmt.Printf("store: %s\n", sc.describe())
	st, err := sc.open()
	if err != nil {
		fail(err)
	}
	anon.sample()
	// A store of an earlier format is upgraded by this first open.
	fmt.Printf("first open: %s\n", time.Since(t).Round(time.Microsecond))

	start := time.Now()
	total := int64(*n + *parked + *failed)
	// receivedAt spreads the receipt times over the span in id order.
	spanStart := start.UTC().Add(-*span)
	receivedAt := func(i int64) time.Time {
		if total == 0 {
			return spanStart
		}
		return spanStart.Add(time.Duration(float64(*span) * float64(i+1) / float64(total)))
	}
	var next, done atomic.Int64
	var wg sync.WaitGroup
	prog := newProgress(start, int64(*progress))
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
				at := receivedAt(i)
				rec := record(*prefix+strconv.FormatInt(i, 10), at, *retention+*margin)
				if _, err := st.Insert(ctx, rec); err != nil {
					fail(err)
				}
				if _, err := st.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
					// Delivered 40 ms after its receipt, as a live forward.
					updated := at.Add(40 * time.Millisecond)
					d.State, d.Lease, d.UpdatedAt = state, store.Lease{}, updated
					d.LastStatus = 200
					switch state {
					case store.StateParked:
						d.LastStatus, d.LastError, d.Failures = 503, "app answered 503", 20
					case store.StateFailed:
						d.LastStatus, d.LastError, d.Failures, d.DueAt = 503, "app answered 503", 1, start.Add(24*time.Hour)
					}
					return nil
				}); err != nil {
					fail(err)
				}
				prog.note(done.Add(1))
			}
		})
	}
	if *history {
		wg.Go(func() {
			if err := writeHistory(ctx, st, spanStart, *span, total); err != nil {
				fail(err)
			}
		})
	}
	wg.Wait()
	fmt.Printf("stored %d results in %s (%.0f/s)\n", total, time.Since(start).Round(time.Millisecond), float64(total)/time.Since(start).Seconds())
	fmt.Print(anon.line("the first open and the fill"))
	if err := st.Close(); err != nil {
		fail(err)
	}

	t0 := time.Now()
	st, err = sc.open()
	if err != nil {
		fail(err)
	}
	fmt.Printf("open: %s\n", time.Since(t0).Round(time.Microsecond))
	if b, ok := st.(*badgerstore.Badger); ok {
		t := b.Tables()
		fmt.Printf("tables: %d by level %v, %.1f MiB on disk, of it indexes %.1f MiB (bloom filters %.1f MiB)\n",
			sum(t.Levels), t.Levels, float64(t.OnDisk)/(1<<20), float64(t.Index)/(1<<20), float64(t.Bloom)/(1<<20))
	}
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
	t3 := time.Now()
	seen, pages, err := pageThrough(ctx, st, 1000)
	if err != nil {
		fail(err)
	}
	fmt.Printf("paged scan of every record (ListPage, 1,000 a page): %d in %d pages, %s\n", seen, pages, time.Since(t3).Round(time.Millisecond))
}

// progress prints a line every step results: how many, the rate since the
// line before and overall. note is safe for concurrent use.
type progress struct {
	start time.Time
	step  int64
	mu    sync.Mutex
	last  time.Time
}

func newProgress(start time.Time, step int64) *progress {
	return &progress{start: start, step: step, last: start}
}

func (p *progress) note(done int64) {
	if done%p.step != 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	fmt.Printf("%d stored (%.0f/s over the last %d, %.0f/s overall, %s)\n", done,
		float64(p.step)/now.Sub(p.last).Seconds(), p.step, float64(done)/now.Sub(p.start).Seconds(), now.Sub(p.start).Round(time.Second))
	p.last = now
}

// writeHistory writes a minute record per minute of the span, each with
// the figures of total results received evenly over it.
func writeHistory(ctx context.Context, st fillStore, from time.Time, span time.Duration, total int64) error {
	minutes := int64(span / time.Minute)
	if minutes == 0 {
		return nil
	}
	per := total / minutes
	delay := make([]uint64, store.HistoryBuckets)
	delay[min(3, store.HistoryBuckets-1)] = uint64(per)
	first := from.Truncate(time.Minute)
	for m := range minutes {
		err := st.WriteMinute(ctx, store.HistoryMinute{
			Minute: first.Add(time.Duration(m) * time.Minute), Instance: "fill",
			Received:   map[string]int64{"stored": per},
			Deliveries: map[string]int64{"delivered": per},
			Backlog:    map[store.State]int64{},
			Delay:      delay, Age: delay,
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// sum is the sum of counts.
func sum(counts []int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// anonSampler samples the process's anonymous resident memory (RssAnon
// of /proc/self/status, in kB) every 100 ms and keeps its peak: the Go
// heap and what Badger allocates outside it (memtables, table builders),
// without the file pages of the mapped tables that VmHWM counts.
type anonSampler struct {
	peak atomic.Int64
}

// start samples until the process ends; nothing where there is no
// /proc/self/status (not Linux).
func (a *anonSampler) start() {
	if _, err := rssAnon(); err != nil {
		return
	}
	go func() {
		for {
			a.sample()
			time.Sleep(100 * time.Millisecond)
		}
	}()
}

// sample takes one sample now (the sampler's goroutine, and the fill at
// the moments it wants counted, such as the end of an open shorter than
// the period).
func (a *anonSampler) sample() {
	kb, err := rssAnon()
	for err == nil {
		old := a.peak.Load()
		if kb <= old || a.peak.CompareAndSwap(old, kb) {
			return
		}
	}
}

// line is the output's line of the peak, empty when nothing was sampled.
func (a *anonSampler) line(what string) string {
	if a.peak.Load() == 0 {
		return ""
	}
	return fmt.Sprintf("peak anonymous memory of %s (RssAnon, sampled every 100 ms): %d kB\n", what, a.peak.Load())
}

// rssAnon is RssAnon of /proc/self/status, in kB.
func rssAnon() (int64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no RssAnon in /proc/self/status")
}

// pageThrough reads every record by pages of limit, in received-time
// order, holding one page at a time.
func pageThrough(ctx context.Context, st fillStore, limit int) (seen, pages int, err error) {
	q := store.ListQuery{Limit: limit}
	for {
		p, err := st.ListPage(ctx, q)
		if err != nil {
			return seen, pages, err
		}
		seen += len(p.Records)
		pages++
		if p.Next == nil {
			return seen, pages, nil
		}
		q.After = p.Next
	}
}

// record is a live 2captcha pingback as the handler stores it, received at
// at and expiring retention later.
func record(id string, at time.Time, retention time.Duration) *store.Record {
	body := "id=" + id + "&code=03AGdBq24PBCbwiDRaS_MJ7Z"
	return &store.Record{
		Provider: "2captcha", ID: id, Code: "03AGdBq24PBCbwiDRaS_MJ7Z", Source: store.SourceCallback,
		ReceivedAt: at, Server: "srv0",
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
		Delivery:  store.Delivery{State: store.StateForwarding, Attempts: 1, Lease: store.Lease{Until: at.Add(70 * time.Second)}, UpdatedAt: at},
		ExpiresAt: at.Add(retention),
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fill:", err)
	os.Exit(1)
}
