//go:build unix

// Package bench holds the benchmarks of the pingback plugin. run.sh measures
// the whole HTTP path (plugin against bare reverse_proxy); the benchmarks
// here measure the durable store alone, where most of the plugin's cost
// is: go test -run '^$' -bench . -benchtime 3s ./bench
package bench

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/store/badgerstore"
)

// BenchmarkStore measures what one live callback costs the Badger store
// (journal, group commit; "syncwrites/" the design before the journal:
// Badger's SyncWrites and no journal) with 32 concurrent callers, as at 32
// concurrent clients: "insert" is the durable write before the 200,
// "insert+outcome" adds the outcome update that follows the forward. Besides
// ns/op (wall time per callback across all callers) it reports cpu-us/op:
// the process's CPU time (user+system, fsync included) per callback.
func BenchmarkStore(b *testing.B) {
	for _, bc := range []struct {
		name    string
		outcome bool
		journal int64
	}{
		{"insert", false, 0},
		{"insert+outcome", true, 0},
		{"syncwrites/insert", false, -1},
		{"syncwrites/insert+outcome", true, -1},
	} {
		b.Run(bc.name, func(b *testing.B) {
			st, err := badgerstore.Open(badgerstore.Options{Dir: b.TempDir(), JournalSize: bc.journal})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			ctx := context.Background()
			prefix := strconv.FormatInt(time.Now().UnixNano(), 10)
			var n atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(max(1, 32/runtime.GOMAXPROCS(0)))
			cpu0 := cpuTime()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					rec := callbackRecord(prefix + strconv.FormatInt(n.Add(1), 10))
					if _, err := st.Insert(ctx, rec); err != nil {
						b.Error(err)
						return
					}
					if !bc.outcome {
						continue
					}
					// As the handler records an outcome (App.recordOutcome).
					_, err := st.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
						now := time.Now().UTC()
						d.State, d.Lease, d.LastStatus, d.UpdatedAt = store.StateDelivered, store.Lease{}, 200, now
						d.EndAttempt(d.Attempts, now, 200, store.OutcomeDelivered, "")
						return nil
					})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-us/op")
		})
	}
}

// callbackRecord is a record as the handler stores it for a 2captcha POST,
// its first attempt started in its history.
func callbackRecord(id string) *store.Record {
	now := time.Now().UTC()
	body := "id=" + id + "&code=03AGdBq24PBCbwiDRaS_MJ7Z"
	rec := &store.Record{
		Provider:   "2captcha",
		ID:         id,
		Code:       "03AGdBq24PBCbwiDRaS_MJ7Z",
		Source:     "callback",
		ReceivedAt: now,
		Server:     "srv0",
		Request: store.Request{
			Method:     http.MethodPost,
			URI:        "/cb",
			Host:       "127.0.0.1:9096",
			Proto:      "HTTP/1.1",
			RemoteAddr: "127.0.0.1:40000",
			Header: http.Header{
				"Content-Type":   {"application/x-www-form-urlencoded"},
				"Content-Length": {strconv.Itoa(len(body))},
			},
			Body: []byte(body),
		},
		Delivery: store.Delivery{
			State:     store.StateForwarding,
			Attempts:  1,
			Lease:     store.Lease{Until: now.Add(70 * time.Second)},
			UpdatedAt: now,
		},
		ExpiresAt: now.Add(24 * time.Hour),
	}
	rec.StartAttempt(store.SourceCallback, now)
	return rec
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
