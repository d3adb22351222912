package badgerstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// journalOpts opens the smallest journal, so that tests rotate it often.
func journalOpts(dir string) Options {
	return Options{Dir: dir, JournalSize: minJournalSize}
}

// bigRecord is a forwarding test record with a body of n bytes.
func bigRecord(id string, n int) *store.Record {
	r := testRecord(id, store.StateForwarding)
	r.Request.Body = bytes.Repeat([]byte{'a' + byte(len(id)%26)}, n)
	return r
}

func delivered(d *store.Delivery) error {
	d.State, d.Lease, d.LastStatus, d.UpdatedAt = store.StateDelivered, store.Lease{}, 200, t0
	return nil
}

// A commit whose Badger transaction is lost after its journal record was
// synced (what a power loss does to Badger's unsynced writes) is replayed
// from the journal at the next open, in order with the commits Badger
// kept: inserts and the outcome updates that follow them.
func TestJournalReplaysWhatBadgerLost(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	var lose atomic.Bool
	b.loseCommit = lose.Load
	for i := range 40 {
		lose.Store(i%2 == 1) // every other insert is lost
		mustInsert(t, b, testRecord(fmt.Sprint(i), store.StateForwarding))
	}
	lose.Store(false)
	for i := 0; i < 40; i += 2 { // kept inserts; every fourth update is lost
		lose.Store(i%4 == 2)
		if _, err := b.UpdateDelivery(ctx, key(fmt.Sprint(i)), delivered); err != nil {
			t.Fatal(err)
		}
	}
	lose.Store(false)
	if _, err := b.Get(ctx, key("1")); err == nil {
		t.Fatal("a lost insert is visible before the crash; the test does not lose anything")
	}
	b.crash()

	check := func(b *Badger) {
		t.Helper()
		for i := range 40 {
			r := mustGet(t, b, key(fmt.Sprint(i)))
			want := store.StateForwarding
			if i%2 == 0 {
				want = store.StateDelivered
			}
			if r.State != want || r.Code != "CODE-"+fmt.Sprint(i) {
				t.Errorf("%d after replay: state %s code %q, want %s", i, r.State, r.Code, want)
			}
		}
		checkIndexesOK(t, b)
	}
	b = openTestBadger(t, journalOpts(dir))
	check(b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// A clean close checkpointed everything: nothing to replay, same state.
	b = openTestBadger(t, journalOpts(dir))
	check(b)
}

// Many rotations of the journal (each starting a checkpoint), then a
// crash: every acknowledged record is there after the next open.
func TestJournalRotationsThenCrash(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	const n, workers = 1200, 8
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if _, err := b.Insert(ctx, bigRecord(fmt.Sprint(i), 16<<10)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	cps := b.journal.checkpoints.Load()
	if cps < 4 {
		t.Errorf("%d checkpoints for about %d MiB through a %d MiB journal, want at least 4", cps, n*16>>10, minJournalSize>>20)
	}
	b.crash()
	b = openTestBadger(t, journalOpts(dir))
	for i := range n {
		if r := mustGet(t, b, key(fmt.Sprint(i))); len(r.Request.Body) != 16<<10 {
			t.Fatalf("%d: body of %d bytes", i, len(r.Request.Body))
		}
	}
	checkIndexesOK(t, b)
}

// A torn record at the end of the journal (a crash during its write,
// never acknowledged) is ignored at open, and the next record takes its
// place.
func TestJournalTornTail(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	var lose atomic.Bool
	b.loseCommit = lose.Load
	lose.Store(true)
	for i := range 10 {
		mustInsert(t, b, testRecord(fmt.Sprint(i), store.StateForwarding))
	}
	j := b.journal
	end, seq := j.off, j.seq
	b.crash()

	// A record header for the next seq whose payload never made it.
	f, err := os.OpenFile(filepath.Join(dir, journalName+".0"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var hdr [journalHeader]byte
	binary.LittleEndian.PutUint32(hdr[0:], journalMagic)
	binary.LittleEndian.PutUint32(hdr[4:], 100)
	binary.LittleEndian.PutUint64(hdr[8:], seq+1)
	binary.LittleEndian.PutUint32(hdr[16:], 12345)
	if _, err := f.WriteAt(append(hdr[:], "torn"...), end); err != nil {
		t.Fatal(err)
	}
	f.Close()

	b = openTestBadger(t, journalOpts(dir))
	for i := range 10 {
		mustGet(t, b, key(fmt.Sprint(i)))
	}
	b.loseCommit = lose.Load
	for i := 10; i < 20; i++ {
		mustInsert(t, b, testRecord(fmt.Sprint(i), store.StateForwarding))
	}
	b.crash()
	b = openTestBadger(t, journalOpts(dir))
	for i := range 20 {
		mustGet(t, b, key(fmt.Sprint(i)))
	}
	checkIndexesOK(t, b)
}

// The durability guard: under concurrent load, every acknowledged insert
// is in a journal record on disk whose sync completed before the insert
// returned, and a sync completed between each insert's call and its
// return. Syncs are counted by a wrapper around the real fdatasync.
func TestJournalAckAfterSync(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	var syncs atomic.Uint64
	b.journal.sync = func(f *os.File) error {
		err := syncData(f)
		syncs.Add(1)
		return err
	}
	const n, workers = 2000, 32
	type ack struct {
		before, after uint64 // completed syncs at the call and at the return
		synced        uint64 // seq of the last synced record at the return
	}
	acks := make([]ack, n)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				a := ack{before: syncs.Load()}
				if _, err := b.Insert(ctx, testRecord(fmt.Sprint(i), store.StateForwarding)); err != nil {
					t.Error(err)
					return
				}
				a.after, a.synced = syncs.Load(), b.journal.synced.Load()
				acks[i] = a
			}
		})
	}
	wg.Wait()
	commits := b.Commits()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	// Which journal record holds each record's r/ key, read from disk.
	seqOf := map[string]uint64{}
	for i := range 2 {
		f, err := os.Open(filepath.Join(dir, fmt.Sprintf("%s.%d", journalName, i)))
		if err != nil {
			t.Fatal(err)
		}
		run, err := readRun(f, i)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range run {
			p := make([]byte, r.n)
			if _, err := f.ReadAt(p, r.off+journalHeader); err != nil {
				t.Fatal(err)
			}
			writes, err := decodeJournal(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range writes {
				if k := string(w.key); strings.HasPrefix(k, recordPrefix) {
					seqOf[k] = r.seq
				}
			}
		}
		f.Close()
	}
	for i, a := range acks {
		seq, ok := seqOf[string(recordKey(key(fmt.Sprint(i))))]
		switch {
		case !ok:
			t.Errorf("insert %d acknowledged, but its record is in no journal record on disk", i)
		case seq > a.synced:
			t.Errorf("insert %d acknowledged when record %d was the last synced, but it is in record %d", i, a.synced, seq)
		case a.after <= a.before:
			t.Errorf("insert %d acknowledged with no sync completed during the call (%d before, %d after)", i, a.before, a.after)
		}
	}
	t.Logf("%d inserts, %d commits, %d journal syncs (%.1f inserts per sync)", n, commits, syncs.Load(), float64(n)/float64(syncs.Load()))
}

// killChildEnv names the store directory of a child process of
// TestJournalSIGKILL; set only in the child.
const killChildEnv = "PINGBACK_TEST_JOURNAL_KILL_DIR"

// SIGKILL at random moments under load, many times, on the same store (a
// process crash only: the page cache, and so Badger's unsynced writes,
// survive it whatever the checkpoints do; power loss is what
// TestJournalPowerLoss, TestJournalReplaysWhatBadgerLost and
// TestJournalCheckpoint* simulate): a
// child process inserts records (some of them then marked delivered) from
// several goroutines through a small journal that rotates every few
// hundred records, printing each acknowledgement; it is killed at a random
// moment. After each kill every acknowledged record is in the store, in
// its acknowledged state, with consistent indexes.
func TestJournalSIGKILL(t *testing.T) {
	if dir := os.Getenv(killChildEnv); dir != "" {
		killChild(dir)
		return
	}
	rounds := 12
	if testing.Short() {
		rounds = 3
	}
	dir := t.TempDir()
	acked := map[string]bool{} // id → delivered acknowledged too
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^TestJournalSIGKILL$", "-test.count=1")
		cmd.Env = append(os.Environ(), killChildEnv+"="+dir, fmt.Sprintf("PINGBACK_TEST_ROUND=%d", round))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		lines := make(chan string, 1024)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		// Kill at a random moment between 50 and 600 ms after the first
		// acknowledgement.
		var kill <-chan time.Time
		n := 0
		for l := range lines {
			if kill == nil {
				kill = time.After(time.Duration(50+rand.IntN(550)) * time.Millisecond)
			}
			select {
			case <-kill:
				_ = cmd.Process.Kill()
				kill = make(chan time.Time) // never again
			default:
			}
			id, done := strings.CutPrefix(l, "DONE ")
			if !done {
				id, _ = strings.CutPrefix(l, "ACK ")
			}
			acked[id] = acked[id] || done
			n++
		}
		_ = cmd.Wait()
		if n == 0 {
			t.Fatalf("round %d: the child acknowledged nothing", round)
		}

		b := openTestBadger(t, journalOpts(dir))
		for id, done := range acked {
			r, err := b.Get(ctx, key(id))
			if err != nil {
				t.Fatalf("round %d: acknowledged %s: %v", round, id, err)
			}
			if r.Code != "CODE-"+id || (done && r.State != store.StateDelivered) {
				t.Fatalf("round %d: %s is %s with code %q; want code CODE-%s, delivered %v", round, id, r.State, r.Code, id, done)
			}
		}
		checkIndexesOK(t, b)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: %d acknowledgements, %d records checked", round, n, len(acked))
	}
}

// killChild loads the store in dir until it is killed.
func killChild(dir string) {
	b, err := openChecked(journalOpts(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var mu sync.Mutex
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		_, _ = os.Stdout.WriteString(s + "\n")
	}
	round := os.Getenv("PINGBACK_TEST_ROUND")
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("%s-%d-%d", round, w, i)
				if _, err := b.Insert(context.Background(), bigRecord(id, 1+rand.IntN(8<<10))); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				say("ACK " + id)
				if i%2 == 0 {
					if _, err := b.UpdateDelivery(context.Background(), key(id), delivered); err != nil {
						fmt.Fprintln(os.Stderr, err)
						os.Exit(1)
					}
					say("DONE " + id)
				}
			}
		})
	}
	wg.Wait()
}

// A checkpoint that cannot make Badger's files durable frees nothing: the
// journal file it would have freed is not reused, the commit that needs it
// fails loudly, and every acknowledged record survives a crash of Badger's
// unsynced writes.
func TestJournalCheckpointFailureFreesNothing(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	var lose atomic.Bool
	b.loseCommit = lose.Load
	b.journal.syncBadger = func(*os.File) error { return errors.New("injected fsync failure") }
	fails := b.Stats().CheckpointFailures
	acked := 0
	var insertErr error
	for i := 0; i < 2000 && insertErr == nil; i++ {
		// Badger "loses" every commit: only the journal keeps them.
		lose.Store(true)
		if _, insertErr = b.Insert(ctx, bigRecord(fmt.Sprint(i), 16<<10)); insertErr == nil {
			acked++
		}
	}
	if insertErr == nil || !strings.Contains(insertErr.Error(), "injected fsync failure") {
		t.Fatalf("after %d inserts through a journal whose checkpoints fail: %v, want the checkpoint's error", acked, insertErr)
	}
	if got := b.Stats().CheckpointFailures - fails; got == 0 {
		t.Error("the failed background checkpoint was not counted")
	}
	b.crash()
	b = openTestBadger(t, journalOpts(dir))
	for i := range acked {
		mustGet(t, b, key(fmt.Sprint(i)))
	}
	t.Logf("%d inserts acknowledged before the commit failed; all replayed from the journal", acked)
}

// A checkpoint covers only records whose Badger writes its sync of
// Badger's files could have seen: the covered seq never passes the last
// record committed when that sync began.
func TestJournalCheckpointCovers(t *testing.T) {
	b := openTestBadger(t, journalOpts(t.TempDir()))
	var seen []uint64
	b.journal.syncBadger = func(f *os.File) error {
		seen = append(seen, b.journal.synced.Load()) // runs while the committer waits or between its commits
		return f.Sync()
	}
	for i := range 1200 {
		mustInsert(t, b, bigRecord(fmt.Sprint(i), 16<<10))
	}
	b.journal.wg.Wait()
	b.journal.mu.Lock()
	covered := b.journal.covered
	b.journal.mu.Unlock()
	if len(seen) == 0 || covered > slices.Max(seen) {
		t.Fatalf("covered %d after Badger syncs that began at records %v", covered, seen)
	}
}

// A journal written with larger files is read whole when opened with a
// smaller JournalSize: records past the smaller size (here the newest, so
// no gap would show their loss) are replayed.
func TestJournalSizeChange(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir, JournalSize: 2 * minJournalSize})
	var lose atomic.Bool
	lose.Store(true)
	b.loseCommit = lose.Load
	const n = 400 // about 6.5 MiB: past the smaller size, in the first file
	for i := range n {
		mustInsert(t, b, bigRecord(fmt.Sprint(i), 16<<10))
	}
	if b.journal.cur != 0 || b.journal.off <= minJournalSize {
		t.Fatalf("journal at file %d offset %d: the test needs records past %d in the first file", b.journal.cur, b.journal.off, minJournalSize)
	}
	b.crash()
	b = openTestBadger(t, journalOpts(dir))
	for i := range n {
		mustGet(t, b, key(fmt.Sprint(i)))
	}
}
