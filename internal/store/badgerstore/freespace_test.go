package badgerstore

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// fakeFS is an injected statfs: it answers free (or err) and counts calls.
type fakeFS struct {
	mu    sync.Mutex
	free  int64
	err   error
	calls int
}

func (f *fakeFS) statfs(string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.free, f.err
}

func (f *fakeFS) set(free int64, err error) {
	f.mu.Lock()
	f.free, f.err = free, err
	f.mu.Unlock()
}

func (f *fakeFS) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// newTestGuard returns a guard on a fake filesystem and clock that logs to
// an observer.
func newTestGuard(t *testing.T, min int64) (*spaceGuard, *fakeFS, *testkit.Clock, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	fs := &fakeFS{free: 1 << 40}
	clock := testkit.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	g := newSpaceGuard("/var/lib/caddy/pingback", min, zap.New(core), fs.statfs)
	if g == nil {
		t.Fatal("newSpaceGuard returned a disabled guard")
	}
	g.now = clock.Now
	return g, fs, clock, logs
}

const MiB = 1 << 20

func TestSpaceGuard(t *testing.T) {
	errStat := errors.New("input/output error")
	type step struct {
		after time.Duration // clock advance before the call
		free  int64
		err   error
		want  bool
		// logs expected from this call: level and a substring of the
		// message; "" level means none.
		level zapcore.Level
		msg   string
	}
	none := zapcore.Level(-100)
	tests := []struct {
		name  string
		steps []step
	}{
		{"above the threshold", []step{
			{0, 500 * MiB, nil, true, none, ""},
			{time.Second, 65 * MiB, nil, true, none, ""},
		}},
		{"exactly at the threshold", []step{
			{0, 64 * MiB, nil, true, none, ""},
		}},
		{"below the threshold", []step{
			{0, 64*MiB - 1, nil, false, zapcore.ErrorLevel, "below min_free_space 64 MiB"},
			{time.Second, 10 * MiB, nil, false, none, ""}, // logged already
		}},
		{"message", []step{
			{0, 10 * MiB, nil, false, zapcore.ErrorLevel,
				"storage unavailable: 10 MiB free on the filesystem of /var/lib/caddy/pingback, below min_free_space 64 MiB; new results are not stored until space is freed"},
			{time.Second, 10 * MiB, nil, false, none, ""}, // logged already
			{time.Second, 0, nil, false, none, ""},
		}},
		{"statfs error", []step{
			{0, 0, errStat, false, zapcore.ErrorLevel, "storage unavailable: cannot read free space on the filesystem of /var/lib/caddy/pingback"},
			{time.Second, 0, errStat, false, none, ""},
		}},
		{"recovery", []step{
			{0, 1 * MiB, nil, false, zapcore.ErrorLevel, "storage unavailable: 1.0 MiB free"},
			{10 * time.Second, 100 * MiB, nil, true, zapcore.WarnLevel,
				"storage available again: 100 MiB free on the filesystem of /var/lib/caddy/pingback, min_free_space 64 MiB; storing resumes"},
			{time.Second, 100 * MiB, nil, true, none, ""},
			{time.Second, 1 * MiB, nil, false, zapcore.ErrorLevel, "storage unavailable: 1.0 MiB free"}, // a new episode logs at once
		}},
		{"recovery from a statfs error", []step{
			{0, 0, errStat, false, zapcore.ErrorLevel, "cannot read free space"},
			{time.Second, 1 << 30, nil, true, zapcore.WarnLevel, "storage available again"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, fs, clock, logs := newTestGuard(t, 64*MiB)
			for i, s := range tt.steps {
				clock.Advance(s.after)
				fs.set(s.free, s.err)
				if got := g.available(); got != s.want {
					t.Fatalf("step %d (free %d, err %v): available() = %v, want %v", i, s.free, s.err, got, s.want)
				}
				got := logs.TakeAll()
				if s.level == none {
					if len(got) != 0 {
						t.Fatalf("step %d: logged %q, want nothing", i, got[0].Message)
					}
					continue
				}
				if len(got) != 1 || got[0].Level != s.level || !strings.Contains(got[0].Message, s.msg) {
					t.Fatalf("step %d: logged %v, want one %s line containing %q", i, entries(got), s.level, s.msg)
				}
				if s.err != nil && got[0].ContextMap()["error"] != s.err.Error() {
					t.Errorf("step %d: error field %v, want %q", i, got[0].ContextMap()["error"], s.err)
				}
			}
		})
	}
}

// entries renders log entries for failure messages.
func entries(es []observer.LoggedEntry) []string {
	out := make([]string, 0, len(es))
	for _, e := range es {
		out = append(out, e.Level.String()+": "+e.Message)
	}
	return out
}

// A reading stands for 100 ms: calls in between do not ask the filesystem
// and return the cached answer, even after the filesystem changed.
func TestSpaceGuardCachesReading(t *testing.T) {
	g, fs, clock, _ := newTestGuard(t, 64*MiB)
	if !g.available() || fs.count() != 1 {
		t.Fatalf("first call: statfs calls %d, want 1", fs.count())
	}
	fs.set(0, nil) // the disk fills
	for range 10 {
		clock.Advance(9 * time.Millisecond) // up to 90 ms after the reading
		if !g.available() {
			t.Fatal("answer changed within 100 ms of the reading")
		}
	}
	if fs.count() != 1 {
		t.Fatalf("statfs called %d times within 100 ms, want once", fs.count())
	}
	clock.Advance(10 * time.Millisecond) // exactly 100 ms
	if g.available() {
		t.Fatal("still available 100 ms after the reading, with the disk full")
	}
	if fs.count() != 2 {
		t.Fatalf("statfs calls %d after 100 ms, want 2", fs.count())
	}
	fs.set(1<<30, nil) // space returns
	clock.Advance(99 * time.Millisecond)
	if g.available() {
		t.Fatal("recovered within 100 ms of the last reading")
	}
	clock.Advance(time.Millisecond)
	if !g.available() || fs.count() != 3 {
		t.Fatalf("not recovered at the next reading (statfs calls %d)", fs.count())
	}
}

// Concurrent callers share one reading per interval.
func TestSpaceGuardConcurrentCallersReadOnce(t *testing.T) {
	g, fs, clock, _ := newTestGuard(t, 64*MiB)
	for round := 1; round <= 3; round++ {
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				if !g.available() {
					t.Error("unavailable with the disk empty")
				}
			})
		}
		wg.Wait()
		if fs.count() != round {
			t.Fatalf("round %d: statfs called %d times in all, want %d", round, fs.count(), round)
		}
		clock.Advance(checkEvery)
	}
}

// While the store stays unavailable the error is repeated once a minute,
// not at every reading.
func TestSpaceGuardLogRateLimit(t *testing.T) {
	g, fs, clock, logs := newTestGuard(t, 64*MiB)
	fs.set(MiB, nil)
	// Three and a half minutes of readings every 100 ms, as a busy
	// store would make them.
	for i := 0; i <= 2100; i++ {
		if g.available() {
			t.Fatalf("reading %d: available with 1 MiB free", i)
		}
		clock.Advance(checkEvery)
	}
	if fs.count() != 2101 {
		t.Fatalf("statfs called %d times, want 2101", fs.count())
	}
	got := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	if len(got) != 4 { // at 0, 1, 2 and 3 minutes
		t.Fatalf("%d error lines in 3.5 minutes, want 4: %v", len(got), entries(got))
	}
	for i, e := range got {
		want := time.Duration(i) * time.Minute
		if d, _ := e.ContextMap()["unavailable_for"].(time.Duration); d != want {
			t.Errorf("error line %d: unavailable_for %v, want %v", i, d, want)
		}
	}
	if n := logs.Len(); n != 4 {
		t.Fatalf("%d lines in all, want 4", n)
	}
	// Recovery is logged once, however often it is read afterwards.
	fs.set(1<<30, nil)
	for range 20 {
		g.available()
		clock.Advance(checkEvery)
	}
	rec := logs.FilterLevelExact(zapcore.WarnLevel).All()
	if len(rec) != 1 || !strings.Contains(rec[0].Message, "storage available again") {
		t.Fatalf("recovery lines %v, want one", entries(rec))
	}
	if d, _ := rec[0].ContextMap()["unavailable_for"].(time.Duration); d != 2101*checkEvery {
		t.Errorf("recovery: unavailable_for %v, want %v", d, 2101*checkEvery)
	}
}

func TestSpaceGuardDisabled(t *testing.T) {
	fs := &fakeFS{}
	for _, min := range []int64{0, -1} {
		g := newSpaceGuard("/x", min, nil, fs.statfs)
		if g != nil {
			t.Fatalf("min %d: guard enabled", min)
		}
		if !g.available() {
			t.Fatalf("min %d: disabled guard says unavailable", min)
		}
	}
	if fs.count() != 0 {
		t.Fatalf("disabled guard called statfs %d times", fs.count())
	}
}

// The platform's statfs reads the real filesystem of a directory.
func TestDefaultStatfs(t *testing.T) {
	if !haveStatfs {
		t.Skip("no statfs on this platform")
	}
	dir := t.TempDir()
	free, err := defaultStatfs(dir)
	if err != nil || free <= 0 {
		t.Fatalf("defaultStatfs(%s) = %d, %v", dir, free, err)
	}
	if _, err := defaultStatfs(dir + "/missing"); err == nil {
		t.Fatal("defaultStatfs of a missing directory: no error")
	}
	if mp := mountPoint(dir); mp == "" || !strings.HasPrefix(dir, mp) {
		t.Fatalf("mountPoint(%s) = %q", dir, mp)
	}
}

// DefaultMinFreeSpace is derived for the options Open really uses:
// if they change, the derivation (the comment of [DefaultMinFreeSpace],
// and [growthBound]) must be redone.
func TestDefaultMinFreeSpaceMatchesOptions(t *testing.T) {
	b := openTestBadger(t, Options{Dir: t.TempDir()})
	o := b.db.Opts()
	got := map[string]int64{
		"MemTableSize":        o.MemTableSize,
		"ValueLogFileSize":    o.ValueLogFileSize,
		"NumLevelZeroTables":  int64(o.NumLevelZeroTables),
		"BaseTableSize":       o.BaseTableSize,
		"BaseLevelSize":       o.BaseLevelSize,
		"LevelSizeMultiplier": int64(o.LevelSizeMultiplier),
		"TableSizeMultiplier": int64(o.TableSizeMultiplier),
		"NumCompactors":       int64(o.NumCompactors),
		"ValueThreshold":      o.ValueThreshold,
	}
	want := map[string]int64{
		"MemTableSize":        boundMemTableSize,
		"ValueLogFileSize":    boundValueLogFileSize,
		"NumLevelZeroTables":  boundNumLevelZeroTables,
		"BaseTableSize":       boundBaseTableSize,
		"BaseLevelSize":       boundBaseLevelSize,
		"LevelSizeMultiplier": boundLevelMultiplier,
		"TableSizeMultiplier": boundTableMultiplier,
		"NumCompactors":       2,                       // the bound counts two compactions at once
		"ValueThreshold":      store.MaxRecordSize + 1, // every record stays out of the value log
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("the store opens Badger with %s %d, the free-space bound assumes %d: redo the derivation in freespace.go", k, got[k], w)
		}
	}
	if bound := growthBound(o); bound != boundGrowth || DefaultMinFreeSpace < bound {
		t.Errorf("growth bound for the store's options %d (constants: %d), DefaultMinFreeSpace %d", bound, int64(boundGrowth), DefaultMinFreeSpace)
	}
	if DefaultMinFreeSpace < 64<<20 || DefaultMinFreeSpace%(1<<20) != 0 {
		t.Errorf("DefaultMinFreeSpace %d: want a whole number of MiB, at least 64 MiB", DefaultMinFreeSpace)
	}
	t.Logf("DefaultMinFreeSpace %d MiB (bound %.1f MiB)", DefaultMinFreeSpace>>20, float64(boundGrowth)/(1<<20))
}
