package badgerstore

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
	"github.com/dgraph-io/badger/v4"
)

// The journal's checkpoint (syncBadgerFiles) rests on two facts about
// Badger that Badger does not promise; the tests in this file pin them
// to Badger v4.9.6 (go.mod), so that an upgrade that changes either
// fails here, not in a user's store after a power loss.
//
//  1. Every file Badger writes without syncing it itself is a memtable
//     log (*.mem) or a value log (*.vlog), and syncBadgerFiles picks both
//     by those suffixes. Badger names them in DB.mtFilePath ("%05d.mem")
//     and vlogFilePath ("%06d.vlog"), its tables in table.NewFilename
//     ("%06d.sst"). Why the walk at all: DB.Sync syncs only the active
//     memtable's log (memTable.SyncWAL) and the value log, never the
//     rotated memtables waiting in DB.imm for their flush, and no other
//     call of Badger's public API makes those durable while the database
//     stays open and writable (DB.DropPrefix flushes them only when a
//     prefix it is given holds data, and refuses writes meanwhile;
//     DB.Close flushes them at the end); so a checkpoint fsyncs every
//     *.mem it finds. Pinned by TestBadgerFileNamesPinned.
//  2. A memtable log that goes away was flushed into a table that is
//     durable first: DB.flushMemtable calls DB.handleMemTableFlush, which
//     builds the table and writes it with table.CreateTable (an msync
//     with MS_SYNC of the whole mapped file) and then adds it to the
//     manifest (levelsController.addLevel0Table: manifestFile.addChanges,
//     an fsync of MANIFEST); only after that does flushMemtable drop its
//     reference (memTable.DecrRef), whose skiplist OnClose callback, set
//     in DB.openMemTable, deletes the log (the log's z.MmapFile.Delete:
//     munmap, ftruncate to 0, unlink). So a *.mem that a checkpoint does
//     not find any more held nothing the disk lacks. Badger does not
//     fsync the directory between creating the table and unlinking the
//     log: that the table's directory entry is durable before the unlink
//     rests on the filesystem ordering its metadata (ext4's journal
//     commits them in order, and the manifest's fsync commits the
//     transaction that holds the creation); not checked here. Pinned by
//     TestBadgerSyncsTableBeforeDroppingMemtableLog.

// badgerFileKind says which kind of file name is in a Badger directory,
// and whether the checkpoint must fsync it (walked). ok is false for a
// name Badger v4.9.6 never writes.
func badgerFileKind(name string) (kind string, walked, ok bool) {
	numbered := func(ext string, digits int) bool {
		stem, found := strings.CutSuffix(name, ext)
		return found && len(stem) >= digits && strings.Trim(stem, "0123456789") == ""
	}
	switch {
	case numbered(".mem", 5):
		return "memtable log", true, true // written through a mapping, never synced without SyncWrites
	case numbered(".vlog", 6):
		return "value log", true, true // likewise
	case numbered(".sst", 6):
		return "table", false, true // msynced by table.CreateTable before it is used
	case name == "MANIFEST" || name == "MANIFEST-REWRITE":
		return "manifest", false, true // fsynced at each change (manifestFile.addChanges), the rewrite before its rename
	case name == "KEYREGISTRY" || name == "REWRITE-KEYREGISTRY":
		return "key registry", false, true // written with O_DSYNC, then renamed into place (WriteKeyRegistry)
	case name == "DISCARD":
		return "discard stats", false, true // value-log GC's statistics: no data
	case name == "LOCK":
		return "directory lock", false, true // the owner's pid: no data
	}
	return "", false, false
}

// pinOptions returns the Badger options the store opens Badger with
// (read back from a store opened by Open in storeDir), for dir, with smaller
// memtables and value-log files so that a test rotates both quickly. Only
// sizes change: the files Badger names and syncs are those of the store.
// A memtable must stay at least 1/0.15 times ValueThreshold (Badger's
// batch limit), hence 8 MiB.
func pinOptions(t *testing.T, dir, storeDir string) badger.Options {
	t.Helper()
	b, err := Open(journalOpts(storeDir))
	if err != nil {
		t.Fatal(err)
	}
	opts := b.db.Opts()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return opts.WithDir(dir).WithValueDir(dir).WithMemTableSize(8 << 20).WithValueLogFileSize(2 << 20)
}

// pinSet writes one key of n bytes in its own transaction: below the
// store's valueThreshold the value stays in the memtable log, at or above
// it goes to the value log.
func pinSet(t *testing.T, db badgerDB, key string, n int) {
	t.Helper()
	val := bytes.Repeat([]byte{byte('a' + n%26)}, n)
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte(key), val) }); err != nil {
		t.Fatalf("writing %s (%d bytes): %v", key, n, err)
	}
}

// dirNames lists dir's entries.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestBadgerFileNamesPinned runs Badger with the store's options through
// memtable rotations, a flush and value-log rotations, and checks every
// file name it shows in its directory: each must be of a kind the
// checkpoint knows (badgerFileKind) and one the store's directory check
// accepts (isStoreFile); memtable logs, value logs and tables must all
// appear under their names; and syncBadgerFiles must fsync every memtable
// and value log present. A Badger that renamed its logs (a *.wal, say)
// would leave them unsynced by every checkpoint: this test names the file.
func TestBadgerFileNamesPinned(t *testing.T) {
	dir := t.TempDir()
	db, err := openManaged(pinOptions(t, dir, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Errorf("closing badger: %v", err)
		}
	}()
	seen := map[string]bool{}
	look := func() []string {
		names := dirNames(t, dir)
		for _, n := range names {
			seen[n] = true
		}
		return names
	}
	count := func(ext string, in func(string) bool) int {
		n := 0
		for name := range seen {
			if strings.HasSuffix(name, ext) && in(name) {
				n++
			}
		}
		return n
	}
	always := func(string) bool { return true }
	// Write until three memtable logs and two value logs have existed.
	for i := 0; count(".mem", always) < 3 || count(".vlog", always) < 2; i++ {
		if i == 400 {
			t.Fatalf("400 writes of 256 KiB and 100 of 1 MiB rotated no memtable or value log: seen %v", slices.Sorted(maps.Keys(seen)))
		}
		pinSet(t, db, fmt.Sprintf("small-%04d", i), 256<<10)
		if i%4 == 0 {
			pinSet(t, db, fmt.Sprintf("large-%04d", i), valueThreshold)
		}
		look()
	}
	// A rotated memtable is flushed in the background: wait for a table
	// and for a memtable log gone.
	testkit.WaitFor(t, 30*time.Second, "a memtable flushed into a table", func() bool {
		now := look()
		gone := func(name string) bool { return !slices.Contains(now, name) }
		return count(".sst", always) > 0 && count(".mem", gone) > 0
	})

	for _, name := range slices.Sorted(maps.Keys(seen)) {
		if _, _, ok := badgerFileKind(name); !ok {
			t.Errorf("Badger wrote %q, a kind of file the journal's checkpoint does not know: if Badger writes it unsynced, syncBadgerFiles must fsync it", name)
		}
		if !isStoreFile(name) {
			t.Errorf("Badger wrote %q, which isStoreFile does not take for the store's: the store's next open would refuse its directory", name)
		}
	}
	kinds := map[string]bool{}
	for name := range seen {
		kind, _, _ := badgerFileKind(name)
		kinds[kind] = true
	}
	for _, want := range []string{"memtable log", "value log", "table", "manifest", "key registry"} {
		if !kinds[want] {
			t.Errorf("Badger wrote no %s under the name badgerFileKind expects (seen %v)", want, slices.Sorted(maps.Keys(seen)))
		}
	}

	// Every memtable and value log present before and after the walk
	// (a flush may remove one meanwhile) was fsynced by it.
	before := look()
	var synced []string
	err = syncBadgerFiles(dir, func(f *os.File) error {
		synced = append(synced, filepath.Base(f.Name()))
		return f.Sync()
	})
	if err != nil {
		t.Fatal(err)
	}
	after := look()
	walked := map[string]int{}
	for _, name := range before {
		if kind, w, _ := badgerFileKind(name); w && slices.Contains(after, name) {
			walked[kind]++
			if !slices.Contains(synced, name) {
				t.Errorf("syncBadgerFiles did not fsync the %s %s (it fsynced %v)", kind, name, synced)
			}
		}
	}
	for _, name := range synced {
		if _, w, _ := badgerFileKind(name); !w {
			t.Errorf("syncBadgerFiles fsynced %s, which is not a memtable or value log", name)
		}
	}
	if walked["memtable log"] == 0 || walked["value log"] == 0 {
		t.Errorf("the walk had %v to fsync, want memtable and value logs (directory %v)", walked, before)
	}
}

// flushChildEnv names the directory in which the child process of
// TestBadgerSyncsTableBeforeDroppingMemtableLog runs Badger's flushes
// (in its badger subdirectory; the store it reads the options from in
// store). The parent's t.TempDir: the child exits without cleanups.
const flushChildEnv = "PINGBACK_PIN_FLUSH_DIR"

// TestBadgerSyncsTableBeforeDroppingMemtableLog watches, with strace,
// the system calls of a child process that runs Badger (the store's
// options, small memtables, no compaction: every table comes from a
// flush) through two memtable flushes, and checks that Badger made a
// table durable (its data msynced or fsynced whole, and MANIFEST fsynced
// after its creation) before it truncated or unlinked each memtable log:
// the k-th log destroyed needs k tables durable before it. It fails if a
// Badger upgrade deletes a memtable log before the table that holds its
// writes is on disk, which would make the checkpoint's walk skip writes
// that nothing has made durable. strace is needed (.ci/run runs as root,
// where ptrace of a child is allowed); without it the test skips, except
// in CI (CI set), where it fails.
func TestBadgerSyncsTableBeforeDroppingMemtableLog(t *testing.T) {
	if base := os.Getenv(flushChildEnv); base != "" {
		runFlushChild(t, base)
		return
	}
	if runtime.GOOS != "linux" {
		t.Skip("strace is Linux's")
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("strace not found (install the strace package): Badger's flush order is not checked")
		}
		t.Skip("strace not found: Badger's flush order is not checked (CI fails here)")
	}
	base := t.TempDir()
	dir := filepath.Join(base, "badger")
	trace := filepath.Join(t.TempDir(), "strace.out")
	cmd := exec.Command(strace, "-f", "-qq", "-y", "-o", trace,
		"-e", "trace=openat,mmap,msync,fsync,fdatasync,ftruncate,unlink,unlinkat",
		os.Args[0], "-test.run=^TestBadgerSyncsTableBeforeDroppingMemtableLog$", "-test.count=1")
	cmd.Env = append(os.Environ(), flushChildEnv+"="+base)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the traced child: %v\n%s", err, out)
	}
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	flushes, err := checkFlushOrder(strings.Split(string(data), "\n"), dir)
	if err != nil {
		t.Fatal(err)
	}
	if flushes < 2 {
		t.Fatalf("the trace shows %d memtable logs destroyed, want at least 2 (the child waits for two flushes)", flushes)
	}
	t.Logf("%d memtable logs destroyed, each after a durable table", flushes)
}

// runFlushChild is the traced child: Badger in base/badger, written
// until two memtable logs are gone; it exits without closing Badger, so
// that no memtable is dropped by the close.
func runFlushChild(t *testing.T, base string) {
	dir := filepath.Join(base, "badger")
	db, err := openManaged(pinOptions(t, dir, filepath.Join(base, "store")).WithNumCompactors(0))
	if err != nil {
		t.Fatal(err)
	}
	mems := map[string]bool{}
	gone := func() int {
		names := dirNames(t, dir)
		n := 0
		for m := range mems {
			if !slices.Contains(names, m) {
				n++
			}
		}
		for _, name := range names {
			if strings.HasSuffix(name, ".mem") {
				mems[name] = true
			}
		}
		return n
	}
	for i := 0; gone() < 2 && len(mems) < 5; i++ {
		pinSet(t, db, fmt.Sprintf("small-%04d", i), 256<<10)
	}
	testkit.WaitFor(t, 60*time.Second, "two memtable logs flushed and removed", func() bool { return gone() >= 2 })
	os.Exit(0)
}

// straceLine is one line of strace -f output: the pid, then a call.
var straceLine = regexp.MustCompile(`^(?:\[pid\s+)?(\d+)\]?\s+(.*)$`)

// straceResult is a whole call: name(args) = result, with strace's
// padding before the "=".
var straceResult = regexp.MustCompile(`^(\w+)\((.*)\)\s+=\s+(.*)$`)

// straceCall is a system call of the trace, at the lines where it began
// and ended.
type straceCall struct {
	name, args, result string
	start, end         int
}

// parseStrace stitches the calls of strace -f output, whose calls in
// other threads may be split into "<unfinished ...>" and "<... resumed>".
func parseStrace(lines []string) []straceCall {
	type pending struct {
		text  string
		start int
	}
	open := map[string]pending{}
	var calls []straceCall
	for i, line := range lines {
		m := straceLine.FindStringSubmatch(strings.TrimSpace(line))
		if m == nil {
			continue
		}
		pid, text, start := m[1], m[2], i
		if head, ok := strings.CutSuffix(text, " <unfinished ...>"); ok {
			open[pid] = pending{head, i}
			continue
		}
		if strings.HasPrefix(text, "<... ") {
			p, ok := open[pid]
			if !ok {
				continue
			}
			delete(open, pid)
			_, rest, _ := strings.Cut(text, " resumed>")
			text, start = p.text+rest, p.start
		}
		if c := straceResult.FindStringSubmatch(text); c != nil {
			calls = append(calls, straceCall{name: c[1], args: c[2], result: c[3], start: start, end: i})
		}
	}
	return calls
}

// fdPath is the path strace -y prints after a descriptor ("7</a/b>").
var fdPath = regexp.MustCompile(`^-?\d+<(.*)>$`)

// checkFlushOrder checks, in strace -f -y output, that each memtable log
// of dir destroyed (its first ftruncate to 0 or unlink) began only after
// at least as many tables of dir were durable: created, then synced whole
// (msync MS_SYNC of their whole mapping, or fsync/fdatasync) and MANIFEST
// fsynced after their creation, both calls ended. It returns how many
// memtable logs were destroyed.
func checkFlushOrder(lines []string, dir string) (int, error) {
	in := func(p string) bool { return filepath.Dir(p) == filepath.Clean(dir) }
	type table struct{ created, synced int }
	tables := map[string]*table{}
	type mapping struct {
		path string
		size string
	}
	maps := map[string]mapping{}
	var manifestSyncs []int
	destroyed := map[string]int{}
	var order []string
	for _, c := range parseStrace(lines) {
		args := strings.Split(c.args, ", ")
		fd := ""
		if m := fdPath.FindStringSubmatch(args[0]); m != nil {
			fd = m[1]
		}
		if strings.HasPrefix(c.result, "-1") {
			continue // failed
		}
		switch c.name {
		case "openat":
			m := fdPath.FindStringSubmatch(c.result)
			if m != nil && in(m[1]) && strings.HasSuffix(m[1], ".sst") && strings.Contains(c.args, "O_CREAT") {
				tables[m[1]] = &table{created: c.start, synced: -1}
			}
		case "mmap":
			if len(args) == 6 {
				if m := fdPath.FindStringSubmatch(args[4]); m != nil && in(m[1]) {
					maps[c.result] = mapping{m[1], args[1]}
				}
			}
		case "msync":
			if mp, found := maps[args[0]]; found && len(args) == 3 && strings.Contains(args[2], "MS_SYNC") {
				if tb := tables[mp.path]; tb != nil && tb.synced < 0 && args[1] == mp.size {
					tb.synced = c.end
				}
			}
		case "fsync", "fdatasync":
			if tb := tables[fd]; tb != nil && tb.synced < 0 {
				tb.synced = c.end
			}
			if in(fd) && filepath.Base(fd) == "MANIFEST" {
				manifestSyncs = append(manifestSyncs, c.end)
			}
		case "ftruncate", "unlink", "unlinkat":
			path := fd
			if c.name == "ftruncate" && (len(args) != 2 || args[1] != "0") {
				continue
			}
			if c.name != "ftruncate" {
				arg := args[0]
				if c.name == "unlinkat" && len(args) == 3 {
					arg = args[1]
				}
				p, err := strconv.Unquote(arg)
				if err != nil {
					continue
				}
				path = p
			}
			if in(path) && strings.HasSuffix(path, ".mem") {
				if _, seen := destroyed[path]; !seen {
					destroyed[path] = c.start
					order = append(order, path)
				}
			}
		}
	}
	var errs []error
	for k, mem := range order {
		at := destroyed[mem]
		durable := 0
		for _, tb := range tables {
			manifested := slices.ContainsFunc(manifestSyncs, func(end int) bool { return end > tb.created && end < at })
			if tb.synced >= 0 && tb.synced < at && manifested {
				durable++
			}
		}
		if durable < k+1 {
			errs = append(errs, fmt.Errorf("memtable log %s destroyed (trace line %d) with %d tables durable before it, want %d: Badger no longer syncs a table and the manifest before it drops the log it was flushed from (DB.flushMemtable), and syncBadgerFiles relies on that", filepath.Base(mem), at+1, durable, k+1))
		}
	}
	if len(tables) == 0 {
		errs = append(errs, errors.New("the trace shows no table created"))
	}
	return len(order), errors.Join(errs...)
}

// TestCheckFlushOrder feeds checkFlushOrder traces in strace -f -y's
// format (as TestBadgerSyncsTableBeforeDroppingMemtableLog records them)
// of a flush in the order Badger v4.9.6 does it and in the orders an
// upgrade could bring: each of the latter must be reported.
func TestCheckFlushOrder(t *testing.T) {
	const (
		create   = `100 openat(AT_FDCWD</w>, "/d/000001.sst", O_RDWR|O_CREAT|O_EXCL|O_CLOEXEC, 0666) = 15</d/000001.sst>`
		mmap     = `100 mmap(NULL, 8391513, PROT_READ|PROT_WRITE, MAP_SHARED, 15</d/000001.sst>, 0) = 0x7fee4b600000`
		msync    = `100 msync(0x7fee4b600000, 8391513, MS_SYNC) = 0`
		partial  = `100 msync(0x7fee4b600000, 4096, MS_SYNC) = 0`
		async    = `100 msync(0x7fee4b600000, 8391513, MS_ASYNC) = 0`
		fsync    = `100 fsync(15</d/000001.sst>)     = 0`
		manifest = `100 fsync(8</d/MANIFEST>) = 0`
		truncate = `100 ftruncate(11</d/00001.mem>, 0) = 0`
		unlink   = `100 unlinkat(AT_FDCWD</w>, "/d/00001.mem", 0) = 0`
		other    = `100 unlinkat(AT_FDCWD</w>, "/e/00001.mem", 0) = 0`
	)
	for _, tc := range []struct {
		name  string
		trace []string
		ok    bool
	}{
		{"Badger v4.9.6's order", []string{create, mmap, msync, manifest, truncate, unlink}, true},
		{"the table fsynced instead", []string{create, fsync, manifest, unlink}, true},
		{"the msync ends in another thread's lines", []string{create, mmap, `100 msync(0x7fee4b600000, 8391513, MS_SYNC <unfinished ...>`,
			`[pid 101] openat(AT_FDCWD</w>, "/d", O_RDONLY|O_CLOEXEC) = 16</d>`, `100 <... msync resumed>)              = 0`, manifest, truncate}, true},
		{"a log of another directory destroyed first", []string{other, create, fsync, manifest, unlink}, true},
		{"the log truncated before the table is synced", []string{create, mmap, truncate, msync, manifest, unlink}, false},
		{"the log unlinked before the manifest is synced", []string{create, mmap, msync, unlink, manifest}, false},
		{"the msync still running at the truncate", []string{create, mmap, `100 msync(0x7fee4b600000, 8391513, MS_SYNC <unfinished ...>`,
			manifest, truncate, `100 <... msync resumed>) = 0`}, false},
		{"part of the table synced", []string{create, mmap, partial, manifest, unlink}, false},
		{"an asynchronous msync", []string{create, mmap, async, manifest, unlink}, false},
		{"a failed msync", []string{create, mmap, `100 msync(0x7fee4b600000, 8391513, MS_SYNC) = -1 EIO (Input/output error)`, manifest, unlink}, false},
		{"the manifest synced before the table exists", []string{manifest, create, mmap, msync, unlink}, false},
		{"no table at all", []string{manifest, unlink}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := checkFlushOrder(tc.trace, "/d")
			if tc.ok && (err != nil || n != 1) {
				t.Errorf("a correct order: %d memtable logs destroyed (want 1), error %v", n, err)
			}
			if !tc.ok && err == nil {
				t.Error("a wrong order not reported")
			}
		})
	}
}
