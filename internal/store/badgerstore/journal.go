package badgerstore

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"go.uber.org/zap"
)

// The journal is the store's own write-ahead log in front of Badger: the
// durable point before an operation is acknowledged. Badger is opened
// without SyncWrites; each group commit's writes are appended to the
// journal as one record (pwrite into a preallocated file, then fdatasync),
// and only then committed to Badger, unsynced. A checkpoint later makes
// Badger's own files durable (fsync of its memtable logs and value logs:
// on Linux fsync also writes out what was written through a memory
// mapping), after which the journal's space is reused. At open, every
// record after the last checkpoint is replayed into Badger.
//
// Why: Badger's SyncWrites msyncs two memory-mapped logs per commit (the
// memtable log and the value log, the latter even when nothing was
// written to it) and the msync of a mapping that is being written to
// stalls for milliseconds several times a second; one fdatasync of a
// preallocated file, whose blocks are already allocated and written, needs
// no metadata update and is close to the disk's own write latency.
//
// Replay is correct because a record holds absolute writes (sets and
// deletions of whole keys), records are replayed in the order they were
// committed, and every write Badger may hold beyond the checkpoint comes
// from a journal record (Badger is written only after the record is
// durable). Replaying every record after the checkpoint, including those
// Badger already holds, therefore ends in the state after the last record,
// whatever part of them Badger kept.
//
// Layout: two files, pingback-journal.0 and .1, each JournalSize bytes,
// written alternately from their start, and pingback-journal.ckpt, which
// holds the sequence number of the last record a completed checkpoint
// covers (in two slots, written alternately, so that a torn write leaves
// the other one). A record is
//
//	magic   uint32  journalMagic
//	length  uint32  of the payload
//	seq     uint64  1, 2, ...: one more than the record before it
//	crc     uint32  CRC-32C of seq and payload
//	payload         uvarint count, then per write: kind (0 set, 1 delete),
//	                uvarint key length, key, and for a set: uvarint value
//	                length, value, uvarint expiry (Unix seconds, 0 none)
//
// A file's records run from offset 0 while each is intact and its seq is
// one more than the last; what follows is older (smaller seqs) or torn.
// When the current file has no room left for a record, the writer moves to
// the other file, waiting if needed for the checkpoint that covers the
// other file's records, and starts a checkpoint of the file it left, in
// the background.
const (
	journalMagic  = 0x50424a31 // "PBJ1"
	journalHeader = 4 + 4 + 8 + 4
	ckptMagic     = 0x50424b31 // "PBK1"
	ckptSlot      = 512

	// DefaultJournalSize is the size of each of the two journal files:
	// at about 1 KiB per callback (insert and outcome), a checkpoint
	// every 16,000 callbacks.
	DefaultJournalSize = 16 << 20
	// minJournalSize is the smallest JournalSize: it must hold the
	// largest record (a group commit of up to about 2 MiB).
	minJournalSize = 4 << 20

	journalName = "pingback-journal"
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errJournalBroken fails every write after the journal could not take
// back a record whose sync failed, or after Badger refused a transaction
// whose record is in the journal (Badger may hold part of it): the store
// must be opened again, and the open's replay applies the record whole.
var errJournalBroken = errors.New("journal holds a record the database refused or could not take it back: reopen the store")

// journal is the writer side; only the committer calls append, retract
// and close, from one goroutine.
type journal struct {
	dir   string
	size  int64
	files [2]*os.File
	ckpt  *os.File
	cur   int
	off   int64
	seq   uint64    // seq of the last record appended
	last  [2]uint64 // the highest seq written into each file
	buf   []byte

	// sync makes a file's written data durable (fdatasync); tests count
	// or fail it.
	sync func(*os.File) error
	// syncBadger makes one of Badger's memtable or value logs durable
	// (fsync) in a checkpoint; tests capture or fail it.
	syncBadger func(*os.File) error
	log        *zap.Logger
	// syncs counts completed journal syncs (counters too, with the
	// other stores that share them).
	syncs    atomic.Uint64
	counters *Counters
	// synced is the seq of the last record whose sync completed.
	synced atomic.Uint64

	mu       sync.Mutex
	cond     *sync.Cond
	covered  uint64 // highest seq a completed checkpoint covers
	running  bool   // a checkpoint runs
	ckptErr  error  // the last checkpoint's failure, if any
	ckptSlot int    // the checkpoint file's slot written next
	wg       sync.WaitGroup
	broken   atomic.Bool
	// stop, closed by stopWorkers, ends the retries of a failed
	// checkpoint; retryFirst is their first wait (checkpointRetry).
	stop       chan struct{}
	retryFirst time.Duration
	// checkpoints counts completed checkpoints.
	checkpoints atomic.Uint64
}

// journalPos is where a record was appended.
type journalPos struct {
	file int
	off  int64
	end  int64
	seq  uint64
}

// openJournal opens (or creates and preallocates) the journal in dir and
// replays into db every record after the last checkpoint. It returns the
// journal positioned after the last record replayed (the caller then
// checkpoints), and how many records it replayed. syncBadger nil means
// (*os.File).Sync; log receives checkpoint failures; counters (nil: its
// own) count the syncs and checkpoints.
func openJournal(db badgerDB, dir string, size int64, log *zap.Logger, syncBadger func(*os.File) error, counters *Counters) (*journal, int, error) {
	if syncBadger == nil {
		syncBadger = (*os.File).Sync
	}
	if counters == nil {
		counters = new(Counters)
	}
	j := &journal{dir: dir, size: size, sync: syncData, syncBadger: syncBadger, log: log, counters: counters,
		stop: make(chan struct{}), retryFirst: checkpointRetry}
	j.cond = sync.NewCond(&j.mu)
	ok := false
	defer func() {
		if !ok {
			j.closeFiles()
		}
	}()
	for i := range j.files {
		f, err := openPrealloc(filepath.Join(dir, fmt.Sprintf("%s.%d", journalName, i)), size)
		if err != nil {
			return nil, 0, err
		}
		j.files[i] = f
	}
	f, err := openPrealloc(filepath.Join(dir, journalName+".ckpt"), 2*ckptSlot)
	if err != nil {
		return nil, 0, err
	}
	j.ckpt = f
	covered, slot, err := readCheckpoint(f)
	if err != nil {
		return nil, 0, err
	}
	j.covered, j.ckptSlot = covered, slot

	var recs []journalRec
	for i, f := range j.files {
		run, err := readRun(f, i)
		if err != nil {
			return nil, 0, err
		}
		for _, r := range run {
			if r.seq > covered {
				recs = append(recs, r)
			}
		}
	}
	slices.SortFunc(recs, func(a, b journalRec) int { return cmp.Compare(a.seq, b.seq) })
	for i, r := range recs {
		if r.seq != covered+uint64(i)+1 {
			return nil, 0, fmt.Errorf("journal %s: record %d follows the checkpoint at %d, records in between are missing (the journal is damaged; moving the %s.* files away opens the store without them)",
				dir, r.seq, covered+uint64(i), journalName)
		}
		if err := j.replay(db, r); err != nil {
			return nil, 0, err
		}
	}
	j.seq = covered
	if n := len(recs); n > 0 {
		j.seq = recs[n-1].seq
	}
	ok = true
	return j, len(recs), nil
}

// journalRec is a record found in a file.
type journalRec struct {
	file int
	off  int64
	n    int // payload length
	seq  uint64
}

// readRun reads the records of file i from its start, up to the file's
// own size: a file written with a larger JournalSize than the open's keeps
// its size and its records.
func readRun(f *os.File, i int) ([]journalRec, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("reading journal: %w", err)
	}
	size := st.Size()
	var out []journalRec
	var hdr [journalHeader]byte
	var off int64
	var payload []byte
	for off+journalHeader <= size {
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("reading journal: %w", err)
		}
		if binary.LittleEndian.Uint32(hdr[0:]) != journalMagic {
			break
		}
		n := int64(binary.LittleEndian.Uint32(hdr[4:]))
		seq := binary.LittleEndian.Uint64(hdr[8:])
		if off+journalHeader+n > size || (len(out) > 0 && seq != out[len(out)-1].seq+1) {
			break
		}
		payload = slices.Grow(payload[:0], int(n))[:n]
		if _, err := f.ReadAt(payload, off+journalHeader); err != nil {
			break
		}
		crc := crc32.Update(crc32.Checksum(hdr[8:16], crcTable), crcTable, payload)
		if crc != binary.LittleEndian.Uint32(hdr[16:]) {
			break
		}
		out = append(out, journalRec{file: i, off: off, n: int(n), seq: seq})
		off += journalHeader + n
	}
	return out, nil
}

// replay applies the writes of r to db in one transaction.
func (j *journal) replay(db badgerDB, r journalRec) error {
	payload := make([]byte, r.n)
	if _, err := j.files[r.file].ReadAt(payload, r.off+journalHeader); err != nil {
		return fmt.Errorf("reading journal record %d: %w", r.seq, err)
	}
	writes, err := decodeJournal(payload)
	if err != nil {
		return fmt.Errorf("journal record %d: %w", r.seq, err)
	}
	return db.Update(func(txn *badger.Txn) error {
		w := &batch{txn: txn, writes: writes}
		return w.flush()
	})
}

// append writes the writes of one group commit as the next record and
// makes it durable. It returns the record's position for retract.
func (j *journal) append(writes []write) (journalPos, error) {
	if j.broken.Load() {
		return journalPos{}, errJournalBroken
	}
	rec := j.encode(writes)
	n := int64(len(rec))
	if n > j.size {
		return journalPos{}, fmt.Errorf("journal record of %d bytes is larger than the journal file (%d bytes)", n, j.size)
	}
	if j.off+n > j.size {
		if err := j.rotate(); err != nil {
			return journalPos{}, err
		}
	}
	pos := journalPos{file: j.cur, off: j.off, end: j.off + n, seq: j.seq + 1}
	t0 := time.Now()
	if _, err := j.files[j.cur].WriteAt(rec, j.off); err != nil {
		return journalPos{}, fmt.Errorf("writing journal: %w", err)
	}
	err := j.sync(j.files[j.cur])
	j.counters.syncTime.observe(time.Since(t0))
	if err != nil {
		// The record may or may not be on disk: take it back, so that
		// neither replay nor the next record builds on it.
		j.takeBack(pos)
		return journalPos{}, fmt.Errorf("syncing journal: %w", err)
	}
	j.off, j.seq = pos.end, pos.seq
	j.last[j.cur] = pos.seq
	j.syncs.Add(1)
	j.counters.syncs.Add(1)
	j.synced.Store(pos.seq)
	return pos, nil
}

// refused is called when Badger refused the transaction of the record
// just appended. Badger may hold part of it (a commit can fail after some
// of its entries reached the memtable), which a later checkpoint would
// make durable as if it were a consistent state. So the record stays, the
// journal breaks: every later write fails, no checkpoint runs (Close
// leaves the record for replay) and the store reports itself unavailable;
// the next open replays the record whole.
func (j *journal) refused(err error) {
	j.broken.Store(true)
	j.log.Error("the database refused a commit whose journal record is synced; the store takes no more writes until it is opened again, and the open replays the record",
		zap.Uint64("record", j.seq), zap.Error(err))
}

// healthy reports whether the journal takes writes and its last
// checkpoint succeeded.
func (j *journal) healthy() bool {
	if j.broken.Load() {
		return false
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.ckptErr == nil
}

// takeBack overwrites the magic of the record at pos and syncs; if that
// fails the journal is broken.
func (j *journal) takeBack(pos journalPos) {
	var zero [4]byte
	if _, err := j.files[pos.file].WriteAt(zero[:], pos.off); err != nil {
		j.broken.Store(true)
		return
	}
	if err := j.sync(j.files[pos.file]); err != nil {
		j.broken.Store(true)
	}
}

// encode builds the record of the next seq in j.buf.
func (j *journal) encode(writes []write) []byte {
	b := append(j.buf[:0], make([]byte, journalHeader)...)
	b = binary.AppendUvarint(b, uint64(len(writes)))
	for _, w := range writes {
		if w.del {
			b = append(b, 1)
			b = binary.AppendUvarint(b, uint64(len(w.key)))
			b = append(b, w.key...)
			continue
		}
		b = append(b, 0)
		b = binary.AppendUvarint(b, uint64(len(w.key)))
		b = append(b, w.key...)
		b = binary.AppendUvarint(b, uint64(len(w.val)))
		b = append(b, w.val...)
		b = binary.AppendUvarint(b, w.exp)
	}
	payload := b[journalHeader:]
	binary.LittleEndian.PutUint32(b[0:], journalMagic)
	binary.LittleEndian.PutUint32(b[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(b[8:], j.seq+1)
	crc := crc32.Update(crc32.Checksum(b[8:16], crcTable), crcTable, payload)
	binary.LittleEndian.PutUint32(b[16:], crc)
	if cap(b) <= 4<<20 {
		j.buf = b // keep the buffer unless a rare huge batch grew it
	}
	return b
}

// decodeJournal parses a record's payload.
func decodeJournal(p []byte) ([]write, error) {
	errShort := errors.New("truncated payload")
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return 0, errShort
		}
		p = p[n:]
		return v, nil
	}
	bytesN := func() ([]byte, error) {
		n, err := uv()
		if err != nil || n > uint64(len(p)) {
			return nil, errShort
		}
		b := p[:n:n]
		p = p[n:]
		return b, nil
	}
	count, err := uv()
	if err != nil || count > uint64(len(p)) {
		return nil, errShort
	}
	out := make([]write, 0, count)
	for range count {
		if len(p) == 0 {
			return nil, errShort
		}
		kind := p[0]
		p = p[1:]
		key, err := bytesN()
		if err != nil {
			return nil, err
		}
		switch kind {
		case 1:
			out = append(out, write{key: key, del: true})
		case 0:
			val, err := bytesN()
			if err != nil {
				return nil, err
			}
			exp, err := uv()
			if err != nil {
				return nil, err
			}
			out = append(out, write{key: key, val: val, exp: exp})
		default:
			return nil, fmt.Errorf("unknown write kind %d", kind)
		}
	}
	if len(p) != 0 {
		return nil, errors.New("trailing bytes in payload")
	}
	return out, nil
}

// rotate moves the writer to the other file once a checkpoint covers what
// that file holds, and starts a checkpoint of the file it leaves (every
// record in it is committed to Badger by now).
func (j *journal) rotate() error {
	next := 1 - j.cur
	j.mu.Lock()
	for j.covered < j.last[next] && j.running {
		j.cond.Wait()
	}
	if j.covered < j.last[next] {
		// No checkpoint covers it (the last one failed): run one now.
		j.running = true
		j.mu.Unlock()
		err := j.checkpoint(j.seq)
		j.mu.Lock()
		j.running = false
		j.cond.Broadcast()
		if err != nil {
			j.mu.Unlock()
			return err
		}
	}
	j.running = true
	j.mu.Unlock()
	target := j.seq
	j.wg.Go(func() {
		err := j.checkpoint(target) // a failure is logged and counted there
		j.mu.Lock()
		j.running = false
		j.cond.Broadcast()
		j.mu.Unlock()
		if err != nil {
			j.retry(target)
		}
	})
	j.cur, j.off = next, 0
	return nil
}

// checkpointRetry is the first wait before a failed background checkpoint
// is tried again; the wait doubles up to checkpointRetryMax.
const (
	checkpointRetry    = time.Second
	checkpointRetryMax = time.Minute
)

// retry tries a failed background checkpoint of target again, with
// backoff, until one succeeds (this one or another that cleared the
// failure) or the journal closes: the store becomes available again once
// the disk is back, without waiting for the next rotation. It holds
// running only while it checkpoints, so a rotation never waits for its
// backoff.
func (j *journal) retry(target uint64) {
	wait := j.retryFirst
	for {
		select {
		case <-j.stop:
			return
		case <-time.After(wait):
		}
		j.mu.Lock()
		if j.ckptErr == nil || j.running {
			// Cleared, or a rotation's checkpoint runs (and
			// retries itself if it fails).
			j.mu.Unlock()
			return
		}
		j.running = true
		j.mu.Unlock()
		err := j.checkpoint(target)
		j.mu.Lock()
		j.running = false
		j.cond.Broadcast()
		j.mu.Unlock()
		if err == nil {
			return
		}
		wait = min(2*wait, checkpointRetryMax)
	}
}

// checkpoint makes every write Badger holds durable (so every record up
// to seq, all committed to Badger before the call) and records seq as
// covered. A failure is logged at error level, counted
// (Stats.CheckpointFailures) and kept until a checkpoint succeeds: the
// store reports itself unavailable meanwhile and no journal space is
// reused; a background checkpoint is retried (retry), and the next
// rotation tries again before it writes.
func (j *journal) checkpoint(seq uint64) error {
	err := j.doCheckpoint(seq)
	if err != nil {
		j.counters.checkpointFailures.Add(1)
		j.mu.Lock()
		j.ckptErr = err
		j.mu.Unlock()
		j.log.Error("journal checkpoint failed: the journal's space is not reused until one succeeds, and writes fail once the journal is full",
			zap.Uint64("covering", seq), zap.Error(err))
	}
	return err
}

func (j *journal) doCheckpoint(seq uint64) error {
	if err := syncBadgerFiles(j.dir, j.syncBadger); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := privateFiles(j.dir); err != nil {
		// Not a durability matter: the directory is private anyway.
		j.log.Warn("making the store's new files mode 0600 failed", zap.Error(err))
	}
	j.mu.Lock()
	slot := j.ckptSlot
	j.mu.Unlock()
	var b [16]byte
	binary.LittleEndian.PutUint32(b[0:], ckptMagic)
	binary.LittleEndian.PutUint64(b[4:], seq)
	binary.LittleEndian.PutUint32(b[12:], crc32.Checksum(b[:12], crcTable))
	if _, err := j.ckpt.WriteAt(b[:], int64(slot*ckptSlot)); err != nil {
		return fmt.Errorf("checkpoint: writing: %w", err)
	}
	if err := j.sync(j.ckpt); err != nil {
		return fmt.Errorf("checkpoint: syncing: %w", err)
	}
	j.mu.Lock()
	j.ckptSlot = 1 - slot
	if seq > j.covered {
		j.covered = seq
	}
	j.ckptErr = nil
	j.cond.Broadcast()
	j.mu.Unlock()
	j.checkpoints.Add(1)
	j.counters.checkpoints.Add(1)
	return nil
}

// readCheckpoint returns the highest seq a valid slot holds (0 if none)
// and the slot to write next.
func readCheckpoint(f *os.File) (uint64, int, error) {
	var best uint64
	next := 0
	for slot := range 2 {
		var b [16]byte
		if _, err := f.ReadAt(b[:], int64(slot*ckptSlot)); err != nil && !errors.Is(err, io.EOF) {
			return 0, 0, fmt.Errorf("reading journal checkpoint: %w", err)
		}
		if binary.LittleEndian.Uint32(b[0:]) != ckptMagic || crc32.Checksum(b[:12], crcTable) != binary.LittleEndian.Uint32(b[12:]) {
			continue
		}
		if seq := binary.LittleEndian.Uint64(b[4:]); seq >= best {
			best, next = seq, 1-slot
		}
	}
	return best, next, nil
}

// syncBadgerFiles fsyncs (with sync) Badger's memtable logs and value
// logs in dir, and dir itself. A file that goes away meanwhile was flushed
// into a table, which Badger syncs before it removes the log. The files
// are opened read-write: Windows' FlushFileBuffers needs a handle with
// write access.
func syncBadgerFiles(dir string, sync func(*os.File) error) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".mem") && !strings.HasSuffix(name, ".vlog") {
			continue
		}
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		err = sync(f)
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("syncing %s: %w", name, err)
		}
	}
	return syncDir(dir)
}

// close waits for a running checkpoint, checkpoints everything (Badger
// holds every record by now) and closes the files.
func (j *journal) close() error {
	j.stopWorkers()
	var err error
	if !j.broken.Load() {
		err = j.checkpoint(j.seq)
	}
	if cerr := j.closeFiles(); err == nil {
		err = cerr
	}
	return err
}

// stopWorkers ends the retries of a failed checkpoint and waits for the
// running checkpoint.
func (j *journal) stopWorkers() {
	close(j.stop)
	j.wg.Wait()
}

func (j *journal) closeFiles() error {
	var err error
	for _, f := range append(j.files[:], j.ckpt) {
		if f != nil {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
	}
	return err
}

// openPrealloc opens path, creating it with size zero bytes written (not
// a sparse or fallocated file: writing into blocks that are already
// written and allocated changes no metadata, so fdatasync has only the
// data to write).
func openPrealloc(path string, size int64) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening journal: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("opening journal: %w", err)
	}
	if st.Size() >= size {
		return f, nil
	}
	zeros := make([]byte, 1<<20)
	for off := st.Size(); off < size; {
		n := min(int64(len(zeros)), size-off)
		if _, err := f.WriteAt(zeros[:n], off); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("preallocating journal: %w", err)
		}
		off += n
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("preallocating journal: %w", err)
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

// journalExists reports whether dir holds a journal of an earlier open.
func journalExists(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, journalName+".ckpt"))
	return err == nil
}
