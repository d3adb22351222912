package badgerstore

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// powerImage is a power-loss harness for the journal's checkpoints. Badger
// is opened without SyncWrites, so its memtable and value logs (.mem,
// .vlog, written through a memory mapping) are durable only as far as a
// checkpoint's fsync made them; a SIGKILL keeps the page cache, so it
// cannot tell. powerImage is the store's syncBadger: before each fsync of
// a log it reads the file's content (what that fsync makes durable at the
// least), and keeps it once the fsync succeeds. image then builds the
// directory a power loss would leave: Badger's logs as the last successful
// checkpoint fsync of each found them (gone if none did), every other file
// as it is (the journal writes nothing that counts before its fdatasync;
// Badger syncs its tables, manifest and key registry itself).
type powerImage struct {
	mu    sync.Mutex
	files map[string][]byte // log's base name → durable content
	// fail, when set, fails every fsync of Badger's logs, as EIO would.
	fail atomic.Bool
	// readOnly counts handles that could not be written: Windows'
	// FlushFileBuffers fails on them.
	readOnly atomic.Int64
	syncs    atomic.Int64
}

var errInjectedSync = errors.New("injected fsync failure")

func newPowerImage() *powerImage { return &powerImage{files: map[string][]byte{}} }

// sync is the store's syncBadger.
func (p *powerImage) sync(f *os.File) error {
	if p.fail.Load() {
		return errInjectedSync
	}
	if _, err := f.Write(nil); err != nil {
		p.readOnly.Add(1)
	}
	data, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<40))
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	p.syncs.Add(1)
	p.mu.Lock()
	p.files[filepath.Base(f.Name())] = bytes.TrimRight(data, "\x00")
	p.mu.Unlock()
	return nil
}

// opts are journalOpts(dir) with p capturing the checkpoints' fsyncs.
func (p *powerImage) opts(dir string) Options {
	o := journalOpts(dir)
	o.syncBadger = p.sync
	return o
}

// image copies dir into a new directory as a power loss now would leave
// it. Nothing may write meanwhile (see powerLoss). The manifest goes
// first, so that a table Badger writes meanwhile is not referenced.
func (p *powerImage) image(t *testing.T, dir string, withCheckpoints bool) string {
	t.Helper()
	out := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	copyFile := func(name string) {
		var data []byte
		if strings.HasSuffix(name, ".mem") || strings.HasSuffix(name, ".vlog") {
			p.mu.Lock()
			data, ok := p.files[name]
			p.mu.Unlock()
			if !ok || !withCheckpoints {
				return // no fsync covered the file: gone with the power
			}
			if err := os.WriteFile(filepath.Join(out, name), data, 0o600); err != nil {
				t.Fatal(err)
			}
			return
		} else if data, err = os.ReadFile(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	copyFile("MANIFEST")
	for _, e := range entries {
		if name := e.Name(); name != "MANIFEST" && name != "LOCK" {
			copyFile(name)
		}
	}
	return out
}

// halt stops b as a crash would (the committer ends, the running
// checkpoint too, no final checkpoint), runs fn while nothing writes, then
// closes Badger (which no longer matters).
func halt(b *Badger, fn func()) {
	b.once.Do(func() {
		b.stopLoops()
		b.journal.stopWorkers()
		_ = b.journal.closeFiles()
		fn()
		_ = b.db.Close()
	})
}

// missing lists the acknowledged records of acked (id → delivered
// acknowledged too) that the store in dir lacks or holds in another state.
func missing(t *testing.T, dir string, acked map[string]bool) []string {
	t.Helper()
	b := openTestBadger(t, journalOpts(dir))
	defer b.Close()
	var out []string
	for id, done := range acked {
		r, err := b.Get(ctx, key(id))
		if err != nil || r.Code != "CODE-"+id || (done && r.State != store.StateDelivered) {
			out = append(out, id)
		}
	}
	if len(out) == 0 {
		checkIndexesOK(t, b)
	}
	return out
}

// A power loss after many rotations of the journal: every acknowledged
// insert and outcome is in the store rebuilt from what was fsynced. The
// journal's space was reused, so the oldest records rest on the
// checkpoints alone: the same image without the checkpoints' fsyncs must
// lose some (otherwise the test could not catch a checkpoint that makes
// nothing durable).
func TestJournalPowerLoss(t *testing.T) {
	dir := t.TempDir()
	p := newPowerImage()
	b := openTestBadger(t, p.opts(dir))
	const n, workers = 1700, 8 // about 14 MiB: three rotations, within one memtable
	var mu sync.Mutex
	acked := map[string]bool{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				id := fmt.Sprint(i)
				if _, err := b.Insert(ctx, bigRecord(id, 8<<10)); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				acked[id] = false
				mu.Unlock()
				if i%3 == 0 {
					if _, err := b.UpdateDelivery(ctx, key(id), delivered); err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					acked[id] = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	var img, bare string
	halt(b, func() {
		img = p.image(t, dir, true)
		bare = p.image(t, dir, false)
	})
	if cps := b.journal.checkpoints.Load(); cps < 4 {
		t.Errorf("%d checkpoints, want at least 4 (the open's and three rotations')", cps)
	}
	if n := p.readOnly.Load(); n > 0 {
		t.Errorf("%d checkpoint fsyncs through a read-only handle (FlushFileBuffers on Windows needs write access)", n)
	}
	if lost := missing(t, img, acked); len(lost) > 0 {
		t.Errorf("after the power loss %d of %d acknowledged records are missing or stale, e.g. %v", len(lost), len(acked), lost[:min(5, len(lost))])
	}
	if lost := missing(t, bare, acked); len(lost) == 0 {
		t.Errorf("an image without the checkpoints' fsyncs keeps all %d records: the journal's space was never reused, the test proves nothing", len(acked))
	}
	t.Logf("%d records, %d checkpoint fsyncs", len(acked), p.syncs.Load())
}

// While checkpoints fail (every fsync of Badger's logs fails), the journal
// reuses none of its space: writes go on until both files are full, then
// fail with an error, and a power loss then loses nothing acknowledged.
// The failure is loud: logged at error level, counted, and the store
// reports itself unavailable until a checkpoint succeeds again (retried in
// the background: no write is needed to recover).
func TestJournalCheckpointFailure(t *testing.T) {
	dir := t.TempDir()
	p := newPowerImage()
	core, logs := observer.New(zapcore.ErrorLevel)
	o := p.opts(dir)
	o.Logger = zap.New(core)
	b := openTestBadger(t, o)
	b.journal.retryFirst = time.Millisecond
	p.fail.Store(true)
	before := b.Stats().CheckpointFailures
	acked := map[string]bool{}
	var failed error
	rotated := false
	for i := 0; i < 2000 && failed == nil; i++ {
		id := fmt.Sprint(i)
		if _, failed = b.Insert(ctx, bigRecord(id, 8<<10)); failed == nil {
			acked[id] = false
		}
		if !rotated && b.journal.cur == 1 {
			// The first rotation's checkpoint, in the background,
			// failed: nothing failed for a caller yet.
			rotated = true
			b.journal.waitIdle()
			if b.Available() {
				t.Error("Available() after a failed background checkpoint")
			}
		}
	}
	if failed == nil {
		t.Error("2000 inserts of 8 KiB through two 4 MiB journal files with every checkpoint failing: none failed")
	}
	b.journal.waitIdle()
	if b.Available() {
		t.Error("Available() while checkpoints fail")
	}
	if n := b.Stats().CheckpointFailures - before; n < 2 {
		t.Errorf("%d checkpoint failures counted, want at least 2 (the rotation's and the retry's)", n)
	}
	if n := logs.FilterMessageSnippet("checkpoint failed").Len(); n < 2 {
		t.Errorf("%d checkpoint failures logged at error level, want at least 2", n)
	}
	var img string
	func() {
		// Nothing writes (the inserts are sequential) and no retry
		// checkpoints meanwhile.
		b.journal.mu.Lock()
		defer b.journal.mu.Unlock()
		for b.journal.running {
			b.journal.cond.Wait()
		}
		img = p.image(t, dir, true)
	}()

	// The disk recovers: the background retry's checkpoint succeeds,
	// without a write, and writes go on.
	p.fail.Store(false)
	recovered := make(chan struct{})
	go func() {
		b.journal.waitCheckpointed()
		close(recovered)
	}()
	select {
	case <-recovered:
	case <-time.After(30 * time.Second): // a bound on a hang, not a pace
		t.Fatal("no checkpoint succeeded within 30 s of the disk recovering")
	}
	if !b.Available() {
		t.Error("not Available() after a checkpoint succeeded again")
	}
	mustInsert(t, b, bigRecord("after", 8<<10))

	if lost := missing(t, img, acked); len(lost) > 0 {
		t.Errorf("after a power loss while checkpoints failed, %d of %d acknowledged records are missing, e.g. %v", len(lost), len(acked), lost[:min(5, len(lost))])
	}
}
