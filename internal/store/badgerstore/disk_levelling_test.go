package badgerstore

import (
	"context"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
	"github.com/dgraph-io/badger/v4"
)

// diskSample is the size of a store's directory at one moment: bytes
// allocated on disk (st_blocks, what du counts; Badger's memtable logs and
// value logs are sparse files mapped at twice their use) and apparent
// bytes, in all and by kind of file.
type diskSample struct {
	at        time.Duration // since the first insert
	inserted  int64
	allocated int64
	apparent  int64
	byKind    map[string]int64 // allocated bytes by kind: sst, mem, vlog, journal, other
}

// sampleDisk sums every file under dir.
func sampleDisk(dir string) (diskSample, error) {
	s := diskSample{byKind: map[string]int64{}}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil // a table or memtable log removed during the walk
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		info, err := d.Info()
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		var alloc int64
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			alloc = st.Blocks * 512
		} else {
			alloc = info.Size()
		}
		s.allocated += alloc
		s.apparent += info.Size()
		s.byKind[fileKind(d.Name())] += alloc
		return nil
	})
	return s, err
}

// fileKind names what a file of a store directory is.
func fileKind(name string) string {
	switch ext := filepath.Ext(name); {
	case ext == ".sst", ext == ".mem", ext == ".vlog":
		return ext[1:]
	case strings.HasPrefix(name, journalName):
		return "journal"
	default:
		return "other" // MANIFEST, KEYREGISTRY, DISCARD, LOCK, the format files
	}
}

// levellingRecord is a live 2captcha pingback as the handler stores it
// (as bench/fill writes it), received at at and expiring retention later.
func levellingRecord(id string, at time.Time, retention time.Duration) *store.Record {
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

// bodiesOnDisk returns the indexes of the results whose request body
// (only ever in the record's value, r/) some file of dir of one of kinds
// still holds, by kind.
func bodiesOnDisk(t *testing.T, dir string, kinds ...string) map[string][]int {
	t.Helper()
	re := regexp.MustCompile(`id=lvl(\d{8})&code`)
	found := map[string][]int{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		kind := fileKind(e.Name())
		want := false
		for _, k := range kinds {
			want = want || k == kind
		}
		if e.IsDir() || !want {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllSubmatch(data, -1) {
			n, _ := strconv.Atoi(string(m[1]))
			found[kind] = append(found[kind], n)
		}
	}
	return found
}

// TestDiskLevelsOff is the small-scale shape of the steady state of
// issue 37 (docs/benchmarks.md, "Disk that stops growing"): results
// arrive at a steady pace (3,000 a second), each stored and delivered as a
// live pingback is (Insert, then UpdateDelivery to delivered, as
// bench/fill does) and expiring a retention of 2 s after its receipt,
// for 10 retention periods, while what forgets them runs as in the app:
// Badger's TTLs and its own compactions, the store's sweep of the counts
// (each second), value-log GC (GCInterval, here each retention) and
// Expire as the replay loop's housekeeping calls it (here after each
// retention). Badger's TTLs follow the wall clock: the test runs in real
// time. The memtable is 1 MiB (Options.memTableSize; its value threshold
// comes down to 150 KiB, far above a record) and the journal's files
// 4 MiB, so that memtables are flushed and level 0 compacted every
// fraction of a second and the directory's saw-tooth stays small beside
// what a retention holds (with 8 MiB memtables the periods' sizes strayed
// 21% from their level: a memtable and two level-0 tables are more than
// a retention of results at this scale).
//
// The directory's allocated bytes (st_blocks, every file: tables,
// memtable and value logs, the journal, MANIFEST) are sampled every tenth
// of a period; a period's size is the mean of its samples, the level the
// mean of the periods after the third. Each of those must be within 10%
// of the level, and the last not above the third plus 10% (a store that
// only grows fails both). At the end no table, memtable log or value log
// may hold the request body of a result of the first period: expired
// records leave the files, not only the reads.
func TestDiskLevelsOff(t *testing.T) {
	const (
		retention = 2 * time.Second
		periods   = 10
		workers   = 16
	)
	// Results a second: under the race detector the store runs several
	// times slower, so the pace is lower (what matters is that it is
	// steady and that the memtable is flushed several times).
	rate := 3000 / testkit.Slowdown
	dir := t.TempDir()
	// Without the self-checks (Options.SelfCheck): their reads in the
	// committer would cost the pace, which is what is measured.
	b, err := Open(Options{Dir: dir, JournalSize: minJournalSize, GCInterval: retention, memTableSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()

	start := time.Now()
	end := start.Add(periods * retention)
	total := int64(float64(rate) * (end.Sub(start)).Seconds())
	var next, inserted atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= total || failed.Load() != nil {
					return
				}
				// The pace: result i is received at start + i/rate;
				// one the store fell too far behind for is not sent.
				due := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
				time.Sleep(time.Until(due))
				if time.Now().After(end) {
					return
				}
				at := time.Now().UTC()
				rec := levellingRecord(fmt.Sprintf("lvl%08d", i), at, retention)
				if _, err := b.Insert(ctx, rec); err != nil {
					failed.Store(err)
					return
				}
				if _, err := b.UpdateDelivery(ctx, rec.Key(), func(d *store.Delivery) error {
					d.State, d.Lease, d.UpdatedAt, d.LastStatus = store.StateDelivered, store.Lease{}, at.Add(40*time.Millisecond), 200
					return nil
				}); err != nil {
					failed.Store(err)
					return
				}
				inserted.Add(1)
			}
		})
	}

	// The sampler: the directory every tenth of a period.
	var samples []diskSample
	var sampleErr error
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for at := start; at.Before(end) && sampleErr == nil; {
			at = at.Add(retention / 10)
			time.Sleep(time.Until(at))
			var s diskSample
			s, sampleErr = sampleDisk(dir)
			s.at, s.inserted = time.Since(start), inserted.Load()
			samples = append(samples, s)
		}
	}()
	for p := 1; p <= periods; p++ {
		time.Sleep(time.Until(start.Add(time.Duration(p) * retention)))
		// The replay loop's housekeeping: expireUndelivered.
		for {
			gone, err := b.Expire(ctx, time.Now().UTC(), 1000)
			if err != nil {
				t.Fatalf("Expire: %v", err)
			}
			if len(gone) > 0 {
				t.Errorf("Expire reported %d undelivered results; every result was delivered", len(gone))
			}
			if len(gone) < 1000 {
				break
			}
		}
	}
	<-sampled
	if sampleErr != nil {
		t.Fatalf("sampling the store's size: %v", sampleErr)
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("storing: %v", err)
	}

	// Each period's size is the mean of its samples: the directory
	// saws up and down by about a memtable and two level-0 tables as
	// memtables fill and are flushed and compacted.
	type period struct {
		mean, low, high float64
		inserted        int64
		kinds           map[string]float64
	}
	var per []period
	for i := range periods {
		var ps []diskSample
		for _, s := range samples {
			if s.at > time.Duration(i)*retention && s.at <= time.Duration(i+1)*retention+retention/20 {
				ps = append(ps, s)
			}
		}
		if len(ps) == 0 {
			t.Fatalf("no sample in period %d", i+1)
		}
		pd := period{low: float64(ps[0].allocated), kinds: map[string]float64{}, inserted: ps[len(ps)-1].inserted}
		for _, s := range ps {
			pd.mean += float64(s.allocated) / float64(len(ps))
			pd.low, pd.high = min(pd.low, float64(s.allocated)), max(pd.high, float64(s.allocated))
			for k, n := range s.byKind {
				pd.kinds[k] += float64(n) / float64(len(ps))
			}
		}
		per = append(per, pd)
	}
	t.Logf("%d results at %d/s, retention %s; allocated MiB in each period (mean of its samples, low, high; mean by kind):", inserted.Load(), rate, retention)
	for i, pd := range per {
		t.Logf("  period %2d  %6d results  %6.2f  %6.2f  %6.2f   sst %5.2f  mem %5.2f  vlog %5.2f  journal %5.2f  other %5.2f",
			i+1, pd.inserted, pd.mean/(1<<20), pd.low/(1<<20), pd.high/(1<<20),
			pd.kinds["sst"]/(1<<20), pd.kinds["mem"]/(1<<20), pd.kinds["vlog"]/(1<<20), pd.kinds["journal"]/(1<<20), pd.kinds["other"]/(1<<20))
	}
	// A quarter of the pace still fills the memtable several times a
	// period (a busy machine, other packages' tests beside this one, slows
	// the store; the shape, not the speed, is what is checked).
	if got := per[len(per)-1].inserted; got < total/4 {
		t.Fatalf("stored %d results of the %d the pace called for: too few to fill the memtable several times a period", got, total)
	}
	// The shape must be the real one: memtables flushed to tables.
	if per[len(per)-1].kinds["sst"] == 0 {
		t.Fatalf("no table was ever written: the memtable was never flushed")
	}

	later := per[3:]
	level := 0.0
	for _, pd := range later {
		level += pd.mean / float64(len(later))
	}
	worst := 0.0
	for _, pd := range later {
		worst = max(worst, abs(pd.mean-level)/level)
	}
	third, last := per[2].mean, per[len(per)-1].mean
	t.Logf("level (mean of periods 4 to %d) %.2f MiB; largest deviation %.1f%%; last period %.2f MiB against %.2f MiB in period 3",
		periods, level/(1<<20), 100*worst, last/(1<<20), third/(1<<20))
	if worst > 0.10 {
		t.Errorf("the store's size strays %.1f%% from its level %.2f MiB after the third retention period (at most 10%%)", 100*worst, level/(1<<20))
	}
	if last > 1.10*third {
		t.Errorf("the store grew from %.2f MiB in the third retention period to %.2f MiB in the last (at most 10%% more)", third/(1<<20), last/(1<<20))
	}
	logLiveKeys(t, b)

	// Expired records leave the files: no result of the first period is
	// in a table, a memtable log or a value log any more.
	firstPeriod := int(float64(rate) * retention.Seconds())
	for kind, ids := range bodiesOnDisk(t, dir, "sst", "mem", "vlog") {
		old := 0
		for _, id := range ids {
			if id < firstPeriod {
				old++
			}
		}
		if old > 0 {
			t.Errorf("the %s files still hold %d request bodies of results that expired in the first period", kind, old)
		}
	}
}

// logLiveKeys logs how many keys of each prefix the store holds, and
// their bytes (key and value).
func logLiveKeys(t *testing.T, b *Badger) {
	t.Helper()
	keys, size := map[string]int{}, map[string]int{}
	err := b.view(func(txn *badger.Txn) error {
		return eachEntry(txn, func(k, v []byte, _ uint64) {
			p := string(k[:min(2, len(k))])
			keys[p]++
			size[p] += len(k) + len(v)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range slices.Sorted(maps.Keys(keys)) {
		t.Logf("  live %s  %6d keys  %8d bytes", p, keys[p], size[p])
	}
}

func abs(x float64) float64 { return max(x, -x) }
