package badgerstore

import (
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dustin/go-humanize"
	"go.uber.org/zap"
)

// Why a guard at all: Badger v4 memory-maps the files it writes. A memtable
// WAL (.mem) is created sparse at 2×MemTableSize and a value-log file (.vlog)
// at 2×ValueLogFileSize, by truncate, and entries are then copied into the
// mapping; an SST (flush or compaction output) is likewise truncated to its
// final size and copied in. On a full filesystem the page fault that would
// allocate the next block fails, the kernel raises SIGBUS in Badger's own
// goroutine, and the Go runtime ends the whole process ("fatal error: fault
// [signal SIGBUS]" in (*logFile).writeEntry). Nothing can recover that, so
// the store must stop writing while Badger still has room for what it has
// already been given. TestBadgerSIGBUSWithoutGuard shows the crash.

// Badger options the growth bound below depends on. They must match what
// Open opens the database with (MemTableSize, ValueLogFileSize and
// NumLevelZeroTables, BaseTableSize and TableSizeMultiplier are set there,
// the level sizes are Badger's defaults); TestDefaultMinFreeSpaceMatchesOptions
// checks them against an opened store, so a change of options fails a test
// until this is redone.
const (
	boundMemTableSize       = 16 << 20 // MemTableSize
	boundValueLogFileSize   = 16 << 20 // ValueLogFileSize
	boundNumLevelZeroTables = 2        // NumLevelZeroTables
	boundBaseTableSize      = 1 << 20  // BaseTableSize
	boundBaseLevelSize      = 10 << 20 // BaseLevelSize (Badger default)
	boundLevelMultiplier    = 10       // LevelSizeMultiplier (Badger default)
	boundTableMultiplier    = 1        // TableSizeMultiplier (Badger's default is 2)
)

// Worst-case growth of the storage directory after a free-space check that
// passed: the writes admitted until the next check (at most checkEvery =
// 100 ms later) plus the background work they set off. Sizes in bytes; M is
// MemTableSize, B is Badger's largest write request (maxBatchSize, 15% of M:
// a bigger transaction fails with ErrTxnTooBig, so no single write to a log
// file is larger).
const (
	boundBatch = boundMemTableSize * 15 / 100 // B = 2.4 MiB

	// WAL: Badger rotates a memtable once its WAL holds M bytes, so a
	// .mem file is written up to M+B, of its 2M mapped. The current
	// file's unwritten remainder is at most M+B, and the next file, if
	// the window crosses a rotation, gets at most M+B more: 36.8 MiB.
	// (Crossing two rotations in 100 ms takes more than 2M per window,
	// 320 MiB/s of synced writes; the plugin peaks well below 20 MB/s.)
	boundWAL = 2 * (boundMemTableSize + boundBatch)

	// Flush: a rotated memtable becomes one L0 table: the memtable's
	// entries (at most M+B of them, stored uncompressed)
	// plus block index and bloom filter, which stay under 10%: 20.2 MiB.
	// The WAL it replaces is deleted only after the table is written.
	// Measured with Snappy (before tables were uncompressed): 15.2–15.6
	// MiB L0 tables from 16 MiB memtables; uncompressed they stay within
	// the memtable's entries plus index and bloom filter.
	boundL0Table = (boundMemTableSize + boundBatch) * 11 / 10

	// Vlog: values of ValueThreshold (1 MiB) and more go to the value
	// log; the current .vlog file is written up to ValueLogFileSize+B
	// before Badger starts the next. Records are capped at 1 MiB, so this
	// is a reserve for the rare record whose encoding crosses the
	// threshold: 18.4 MiB.
	boundVlog = boundValueLogFileSize + boundBatch

	// Compaction output exists beside its input until the compaction
	// ends, so each running compaction needs as much free space as it
	// reads. The store runs two compactors (NumCompactors), the first
	// preferring L0:
	//
	// L0→Lbase: the NumLevelZeroTables L0 tables (result keys are random
	// ids, so every table overlaps every other) and every Lbase table in
	// their range, all of Lbase, which Badger keeps near BaseLevelSize;
	// counted at twice that for overshoot: 2×20.2 + 20 = 60.5 MiB.
	boundL0Compaction = boundNumLevelZeroTables*boundL0Table + 2*boundBaseLevelSize

	// Li→Li+1 below the base: one Li table of size s and the Li+1
	// tables in its key range: LevelSizeMultiplier×s of data plus the
	// two tables (TableSizeMultiplier×s each) that straddle its ends:
	// (1+10+2)s = 13s. Tables are BaseTableSize at every level
	// (TableSizeMultiplier 1), so this does not grow with the store:
	// s = 1 MiB, 13 MiB. (With Badger's default multiplier of 2 the
	// deepest tables doubled per level, and this bound was 120 MiB for
	// stores up to 10 GiB; a store written then keeps its larger tables
	// until compactions rewrite them.)
	boundDeepTable      = boundBaseTableSize * boundTableMultiplier * boundTableMultiplier
	boundDeepCompaction = (1 + boundLevelMultiplier + 2*boundTableMultiplier) * boundDeepTable

	// boundGrowth is the sum: 148.9 MiB.
	boundGrowth = boundWAL + boundL0Table + boundVlog + boundL0Compaction + boundDeepCompaction
)

// DefaultMinFreeSpace is the default min_free_space in bytes: 256 MiB. It
// was the worst-case growth derived above for the earlier options (tables
// doubling per level: 255.9 MiB); with today's options (tables of 1 MiB
// at every level) the derivation gives 148.9 MiB (boundGrowth), and the
// default is kept at 256 MiB, which also covers a store written with the
// earlier options until its larger tables are rewritten, and the bursts
// measured below (taken with the earlier options). (The value log
// is kept at 16 MiB files: a value goes there only from 1 MiB, and records
// are capped at MaxRecordSize, one byte less, so it is never written.)
//
// The derivation counts one compaction of each kind at a time. Measured on
// tmpfs, with the earlier options (2 cores, 2 KiB
// random bodies, 32 writers): at 2000 records/s, far above the plugin's
// traffic, the directory's peak growth after writes stopped was under 1 MiB
// most of the time, but bursts of compaction grew it by 86–312 MiB in stores
// of 150 MiB–1 GiB, and by up to 564 MiB at 5000 records/s in a 1.3 GiB
// store. So a store that is large, or fed near Badger's compaction speed,
// needs a larger min_free_space; the figure is no guarantee against another
// process filling the disk to the last block while Badger compacts.
const DefaultMinFreeSpace int64 = 256 << 20

// growthBound is the derivation above for the given Badger options, so a
// test can compare DefaultMinFreeSpace with the options a store really has.
func growthBound(o badger.Options) int64 {
	batch := o.MemTableSize * 15 / 100
	wal := 2 * (o.MemTableSize + batch)
	l0Table := (o.MemTableSize + batch) * 11 / 10
	vlog := o.ValueLogFileSize + batch
	l0Compaction := int64(o.NumLevelZeroTables)*l0Table + 2*o.BaseLevelSize
	deepTable := o.BaseTableSize * int64(o.TableSizeMultiplier) * int64(o.TableSizeMultiplier)
	deepCompaction := int64(1+o.LevelSizeMultiplier+2*o.TableSizeMultiplier) * deepTable
	return wal + l0Table + vlog + l0Compaction + deepCompaction
}

const (
	// checkEvery is how long available reuses its last reading before it
	// asks the filesystem again.
	checkEvery = 100 * time.Millisecond
	// relogEvery is how often the error is repeated while the store stays
	// unavailable.
	relogEvery = time.Minute
)

// statfsFunc returns the bytes available to an unprivileged writer
// (Bavail×Bsize on Unix) on the filesystem that holds dir.
type statfsFunc func(dir string) (int64, error)

// spaceGuard tells whether the filesystem of a directory still has at least
// min bytes free. It asks the filesystem at most every checkEvery and answers
// from that reading in between, so it is cheap enough to ask before every
// write. It logs at error level when the directory becomes unavailable
// (statfs failing counts as unavailable), again at most every relogEvery
// while it stays so, and at warn level once when space returns.
//
// A nil *spaceGuard is a disabled guard: always available.
// Safe for concurrent use.
type spaceGuard struct {
	dir    string
	min    int64
	log    *zap.Logger
	statfs statfsFunc
	now    func() time.Time // the clock; tests replace it

	next atomic.Int64 // unix ns before which the last reading stands
	ok   atomic.Bool  // the last reading's answer

	mu       sync.Mutex // guards the fields below and serialises readings
	fs       string     // description of dir's filesystem, for logs; lazy
	downAt   time.Time  // when the store became unavailable
	loggedAt time.Time  // when unavailability was last logged
}

// newSpaceGuard returns a guard for dir that reports unavailable below min
// free bytes. statfs nil means the platform's (defaultStatfs); where the
// platform has none, the guard is disabled (nil) and says so once in log.
// min ≤ 0 also disables it. log nil discards the guard's lines.
func newSpaceGuard(dir string, min int64, log *zap.Logger, statfs statfsFunc) *spaceGuard {
	if log == nil {
		log = zap.NewNop()
	}
	if min <= 0 {
		return nil
	}
	if statfs == nil && haveStatfs {
		statfs = defaultStatfs
	}
	if statfs == nil {
		log.Warn("cannot check free space on this platform; min_free_space is not enforced",
			zap.String("dir", dir), zap.Int64("min_free_space", min))
		return nil
	}
	g := &spaceGuard{dir: dir, min: min, log: log, statfs: statfs, now: time.Now}
	g.ok.Store(true) // until the first reading, which the first call makes
	return g
}

// available reports whether the store may take new writes: the last reading
// of the free space, taken at most checkEvery ago, was at least min. It
// re-reads when the last reading is older; concurrent callers meanwhile get
// the previous answer.
func (g *spaceGuard) available() bool {
	if g == nil {
		return true
	}
	now := g.now()
	next := g.next.Load()
	if now.UnixNano() < next || !g.next.CompareAndSwap(next, now.Add(checkEvery).UnixNano()) {
		return g.ok.Load()
	}
	return g.check(now)
}

// check reads the free space now and records and logs the answer.
func (g *spaceGuard) check(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	free, err := g.statfs(g.dir)
	ok := err == nil && free >= g.min
	was := g.ok.Swap(ok)
	switch {
	case !ok && (was || now.Sub(g.loggedAt) >= relogEvery):
		if was {
			g.downAt = now
		}
		g.loggedAt = now
		g.logDown(free, err, now)
	case ok && !was:
		g.log.Warn(fmt.Sprintf("storage available again: %s free on %s, min_free_space %s; storing resumes",
			humanize.IBytes(uint64(free)), g.fsName(), humanize.IBytes(uint64(g.min))),
			zap.String("dir", g.dir), zap.Int64("free_bytes", free), zap.Int64("min_free_space", g.min),
			zap.Duration("unavailable_for", now.Sub(g.downAt)))
	}
	return ok
}

// logDown logs that the store is (still) unavailable. Called with g.mu held.
func (g *spaceGuard) logDown(free int64, err error, now time.Time) {
	fields := []zap.Field{zap.String("dir", g.dir), zap.Int64("min_free_space", g.min),
		zap.Duration("unavailable_for", now.Sub(g.downAt))}
	if err != nil {
		g.log.Error(fmt.Sprintf("storage unavailable: cannot read free space on %s; new results are not stored until it can be read and is at least min_free_space %s",
			g.fsName(), humanize.IBytes(uint64(g.min))), append(fields, zap.Error(err))...)
		return
	}
	g.log.Error(fmt.Sprintf("storage unavailable: %s free on %s, below min_free_space %s; new results are not stored until space is freed",
		humanize.IBytes(uint64(max(free, 0))), g.fsName(), humanize.IBytes(uint64(g.min))),
		append(fields, zap.Int64("free_bytes", free))...)
}

// fsName describes the filesystem of g.dir for logs: its mount point where
// it can be found, else the directory. Called with g.mu held.
func (g *spaceGuard) fsName() string {
	if g.fs == "" {
		abs, err := filepath.Abs(g.dir)
		if err != nil {
			abs = g.dir
		}
		if mp := mountPoint(abs); mp != "" && mp != abs {
			g.fs = fmt.Sprintf("the filesystem mounted at %s (holding %s)", mp, abs)
		} else {
			g.fs = "the filesystem of " + abs
		}
	}
	return g.fs
}
