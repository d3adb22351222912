package badgerstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	"go.uber.org/zap"
)

// Options configures Open.
type Options struct {
	// Dir is the database directory; created if missing. Required.
	Dir string
	// Logger receives Badger's own log lines (Info is demoted to Debug)
	// and the store's. Nil discards them.
	Logger *zap.Logger
	// MaxBatch caps how many operations one group commit carries.
	// Default 512.
	MaxBatch int
	// LockWait is how long Open keeps retrying while another Badger
	// handle (usually a Caddy process that is shutting down) holds the
	// directory lock. Default 3s.
	LockWait time.Duration
	// GCInterval is the period of value-log garbage collection. Default 5m.
	GCInterval time.Duration
	// LeaseTerm, if positive, asks lease holders to renew every third of
	// it (what a shared store does); tests use it to exercise renewals on
	// Badger. Default 0: no renewals; a lease lapses when the store is
	// reopened, or at its Until, which its holder sets beyond the longest
	// forward (a safety net for an outcome that could not be recorded).
	LeaseTerm time.Duration
	// MinFreeSpace is the free space, in bytes, that the filesystem of
	// Dir must keep: below it every write fails with ErrUnavailable (see
	// [spaceGuard]). 0 means DefaultMinFreeSpace; negative disables the
	// check (tests only: Badger then dies of SIGBUS on a full disk).
	MinFreeSpace int64
	// BeforeCommit, if set, runs before each group commit with the
	// commit's sequence number (1, 2, ...); an error fails that commit as
	// if Badger had refused it. For fault-injection tests.
	BeforeCommit func(n uint64) error
	// JournalSize is the size in bytes of each of the journal's two
	// preallocated files (see [journal]), at least 4 MiB.
	// 0 means DefaultJournalSize; negative opens Badger with SyncWrites
	// and no journal (two msyncs per commit: the design before the
	// journal, kept for comparison). A store opened without the journal
	// first replays and checkpoints what an earlier journaled open left
	// in it.
	JournalSize int64
	// LegacyAccounts maps a provider's name to an account id (Task.
	// Account): given to every task stored before tasks had accounts,
	// once, by the store format 7 upgrade (the first open of a store of
	// format 6 or earlier by this code; later opens ignore it). The app
	// passes the account of each provider's first configured key; a
	// provider missing from the map leaves its tasks without account.
	LegacyAccounts map[string]string
	// Counters, if set, are the counters the store counts its commits,
	// syncs and checkpoints into, shared with the other stores given the
	// same (the root package gives every Badger store of the process the
	// one behind its metrics). Nil: counters of the store's own.
	Counters *Counters
	// SelfCheck makes the store check itself as it runs, for tests: the
	// persisted counts are compared with the keys at open, and every
	// answer of the committer's in-memory shortcuts (presence flags,
	// fresh states) with what Badger holds; a mismatch panics. It costs
	// reads on the committer's path. Default off.
	SelfCheck bool
	// Tables, for measuring the store's table layout against another
	// (bench/fill's -table-size, -table-multiplier, -compression and
	// -block-cache): zero fields keep the store's own, which no option of
	// the plugin changes. See [TableOptions].
	Tables TableOptions

	// statfs, in tests, replaces the platform's reading of free space
	// (nil: statfs(2) or GetDiskFreeSpaceEx).
	statfs statfsFunc
	// gatherMax, if set, replaces the number of records of a state that
	// ListPage gathers (see Badger.gatherCap); tests set 0 to walk the
	// received-time index for every state.
	gatherMax *int
	// syncBadger, in tests, replaces the fsync of Badger's memtable and
	// value logs in a checkpoint (to capture what it made durable, or to
	// fail it).
	syncBadger func(*os.File) error
	// memTableSize, in tests, replaces Badger's memtable size (16 MiB),
	// so that a small store flushes and compacts often. Badger caps a
	// transaction at 15% of it and refuses a value threshold above that:
	// the threshold comes down with it (values from 15% of memTableSize
	// up go to the value log), and a batch of more than 15% of it is
	// committed in halves.
	memTableSize int64
}

// Badger is the single-node Store on Badger v4. Concurrent writes are
// group-committed: one committer goroutine gathers every waiting operation
// into one transaction, appends its writes to the store's journal and
// fdatasyncs it (the durable point), commits the transaction to Badger
// (unsynced; checkpointed later, see [journal.checkpoint]) and then releases
// all their callers with the commit's result. No caller is answered before
// the sync that covers its writes has completed.
//
// Each open is a new lease owner (an epoch counted in the store), so every
// lease of an earlier process lapses at open: a forward cut by a crash is
// claimable as soon as the store is open again. A lease of this open lapses
// at its Until.
type Badger struct {
	db        badgerDB
	log       *zap.Logger
	maxBatch  int
	epoch     uint64
	owner     string
	leaseTerm time.Duration
	hook      func(n uint64) error

	// committer is the group commit: it gathers the submitted ops into
	// batches and runs each with commitBatch, one batch at a time.
	committer *store.Committer[*op]
	mu        sync.RWMutex // guards closed
	closed    bool
	stopGC    chan struct{}
	gcDone    chan struct{}
	closeErr  error
	once      sync.Once
	attempts  atomic.Uint64 // commits attempted, for BeforeCommit
	commits   atomic.Uint64 // transactions committed successfully
	space     *spaceGuard   // nil: free space is not checked
	counters  *Counters     // Options.Counters, or the store's own
	// selfCheck is Options.SelfCheck; gatherMax Options.gatherMax.
	selfCheck bool
	gatherMax *int
	journal   *journal // nil: Badger's SyncWrites is the durable point
	// loseCommit, in tests, drops a journaled commit's Badger transaction
	// when it returns true, as a power loss would have lost it.
	loseCommit func() bool
	// commitTxn, in tests, replaces the commit of the transaction
	// (writes: the batch's writes, in order), to make Badger fail a
	// commit part-way.
	commitTxn func(commit func() error, writes []write) error
	writes    []write       // the committer's: the writes of the batch being committed
	leases    *leaseTracker // the committer's: the leases this handle holds
	events    []leaseEvent  // the committer's: the lease changes of the batch being committed
	counted   []countDelta  // the committer's: the count changes of the batch being committed
	aged      []ageDelta    // the committer's: the age changes of the batch being committed
	scratch   batch         // the committer's: the view each operation of a batch applies through
	counts    *memCounts    // records by provider and state, pending tasks: see [countPrefix]
	cs        countState    // the committer's: the persisted counts' changes of the batch being committed
	swept     uint64        // the committer's: the second up to which expiry buckets have been swept
	sweepDone chan struct{} // closed when the sweep loop exits
	ages      *memAges      // the times behind the age gauges: see [Badger.Ages]
	has       *presence     // the committer's: key kinds the store holds ([presence])
	fresh     *fresh        // the committer's: unchanged live forwards' states ([fresh])
	scrubMu   sync.Mutex    // one scrub at a time ([Badger.scrub])
}

// op is one unit of work for the committer. apply reads through the batch
// (which sees every earlier operation's writes) and buffers its writes
// there; they reach the transaction only if apply succeeds. apply may run
// again on a fresh transaction if the batch has to be retried, so it must
// reset whatever it reports and have no other side effects.
type op struct {
	apply func(w *batch) error
	err   error // apply's own result, or the commit's
	done  chan struct{}
	size  int  // approximate bytes written, for batching
	lazy  bool // no caller waits for it to answer anyone (Deferrable)
	// after, if set, runs in the committer once the op's batch committed
	// (no other batch commits meanwhile); its error becomes the op's.
	after func() error
}

// valueThreshold is Badger's ValueThreshold: values of this many bytes or
// more go to the value log. It is above every value the store writes
// (records are at most MaxRecordSize), so the value log stays empty: its
// garbage collection rewrites entries unsynced and then deletes the old
// file, which the journal's checkpoints would not cover. (Badger refuses a
// threshold above 1 MiB, hence MaxRecordSize one byte below.)
const valueThreshold = store.MaxRecordSize + 1

// badgerTableSize is the size of Badger's tables (BaseTableSize) at every
// level: the store sets TableSizeMultiplier to 1, where Badger's default
// doubles it per level. A compaction holds each table it builds in memory,
// several tables at once (Badger's throttle: 8 plus the sub-compactions
// per compaction): with doubling, the bottom level of a million results
// had 8 MiB tables, and the builders held about 200 MiB of live heap
// during a compaction. Small tables of one size bound that whatever the
// store's size.
const badgerTableSize = 1 << 20

// lazyWait is how long a batch of only deferrable operations waits for an
// operation someone waits on, to share its commit and sync. An operation
// someone waits on is never held back.
const lazyWait = 3 * time.Millisecond

// Open opens (or creates) the database in opts.Dir with memory-lean
// options, in Badger's managed mode with the store's own timestamps (see
// [clock]; a store written in Badger's own mode opens as it is),
// upgrades its stored format if it was written by an earlier version,
// takes a new lease epoch and starts the committer. A directory locked by
// another process is retried for opts.LockWait, then reported with
// guidance.
func Open(opts Options) (*Badger, error) {
	if opts.Dir == "" {
		return nil, errors.New("badger: no directory")
	}
	if opts.Tables.Compression != options.None && opts.Tables.BlockCache <= 0 {
		// Badger would panic in Open; refused before the directory is touched.
		return nil, errors.New("badger: compressed tables need a block cache (Options.Tables.BlockCache)")
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 512
	}
	if opts.LockWait <= 0 {
		opts.LockWait = 3 * time.Second
	}
	if opts.GCInterval <= 0 {
		opts.GCInterval = 5 * time.Minute
	}
	if err := secureStoreDir(opts.Dir); err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	if opts.MinFreeSpace == 0 {
		opts.MinFreeSpace = DefaultMinFreeSpace
	}
	if opts.Counters == nil {
		opts.Counters = new(Counters)
	}
	// Opening writes into memory-mapped files too (a new memtable log):
	// on a full disk that would crash the process, so refuse to open.
	space := newSpaceGuard(opts.Dir, opts.MinFreeSpace, logger, opts.statfs)
	if !space.available() {
		return nil, fmt.Errorf("opening badger database in %s: %w (free space below min_free_space %d bytes)", opts.Dir, store.ErrUnavailable, opts.MinFreeSpace)
	}
	journaled := opts.JournalSize >= 0
	if opts.JournalSize == 0 {
		opts.JournalSize = DefaultJournalSize
	}
	if journaled && opts.JournalSize < minJournalSize {
		return nil, fmt.Errorf("badger: journal size %d below the minimum %d", opts.JournalSize, minJournalSize)
	}
	// One writer (the committer) and its own atomicity: Badger's
	// conflict detection would only cost CPU; its expvar metrics too.
	// Memory: see badgerTableSize. Tables are not compressed: with
	// Snappy (Badger's default) every block read was decompressed into a
	// new heap buffer (kept in a block cache) and every table built held
	// its blocks twice, uncompressed and compressed; with 1,000,000
	// results in a 256 MiB cgroup the mean anonymous memory fell from
	// 174 to 117 MiB without it (docs/benchmarks-lean.md), and the Go heap
	// target with it, which leaves the cgroup room for the tables' file
	// pages. Uncompressed blocks are read from the mapped file in place,
	// so no block cache is needed. The cost is disk: about 3.3 times the
	// bytes (512 against 155 MiB at a million delivered results). Tables
	// written compressed by an earlier version stay readable (Badger
	// keeps each table's codec in its manifest) until compaction
	// rewrites them.
	memTable := cmp.Or(opts.memTableSize, 16<<20)
	bopts := badger.DefaultOptions(opts.Dir).
		WithSyncWrites(!journaled).
		WithDetectConflicts(false).
		WithMetricsEnabled(false).
		WithLogger(newBadgerLogger(opts.Logger)).
		WithMemTableSize(memTable).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(8).
		WithBaseTableSize(cmp.Or(opts.Tables.Size, badgerTableSize)).
		WithCompression(opts.Tables.Compression).
		WithBlockCacheSize(opts.Tables.BlockCache).
		WithIndexCacheSize(16 << 20).
		WithValueThreshold(min(valueThreshold, memTable*15/100)).
		WithValueLogFileSize(16 << 20).
		WithNumCompactors(2)
	// Every level's tables are badgerTableSize, unless measured otherwise.
	bopts.TableSizeMultiplier = cmp.Or(opts.Tables.Multiplier, 1)

	var db badgerDB
	var err error
	deadline := time.Now().Add(opts.LockWait)
	retriedEmptyMem := false
	for {
		db, err = openManaged(bopts)
		if err == nil {
			break
		}
		// A memtable log left empty by a kill (see removeEmptyMemtables),
		// found while this open held the directory's lock: nobody writes
		// it, so it goes and the open is tried once more. Badger wraps
		// the error as text (y.Wrapf), hence the match.
		if !retriedEmptyMem && strings.Contains(err.Error(), "while opening fid") && strings.Contains(err.Error(), "Create a new file") {
			retriedEmptyMem = true
			if rerr := removeEmptyMemtables(opts.Dir); rerr != nil {
				return nil, fmt.Errorf("opening badger database in %s: %w (%v)", opts.Dir, err, rerr)
			}
			logger.Warn("removed empty memtable logs left by a crash; opening again", zap.String("dir", opts.Dir))
			continue
		}
		// Badger formats the lock error with %+v, so errors.Is cannot
		// see it; match the text (its directory lock, in Badger's source:
		// https://github.com/dgraph-io/badger/blob/v4.9.6/dir_unix.go).
		locked := strings.Contains(err.Error(), "Another process is using this Badger database")
		if !locked {
			return nil, fmt.Errorf("opening badger database in %s: %w", opts.Dir, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("badger database in %s is locked by another process; if Caddy is already running, use 'caddy reload' instead of starting a second instance on the same storage_dir: %w", opts.Dir, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var j *journal
	if _, err := checkFormat(db); err != nil {
		// Refused before the journal is opened or replayed: nothing
		// is written.
		_ = db.Close()
		return nil, fmt.Errorf("badger database in %s: %w", opts.Dir, err)
	}
	if journaled || journalExists(opts.Dir) {
		// Without the journal, records an earlier journaled open left
		// are still replayed (and checkpointed below): otherwise this
		// open would diverge from them, and a later journaled open
		// would replay them over newer writes.
		size := opts.JournalSize
		if !journaled {
			size = minJournalSize // existing files keep their size
		}
		var replayed int
		j, replayed, err = openJournal(db, opts.Dir, size, logger, opts.syncBadger, opts.Counters)
		if err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("badger database in %s: %w", opts.Dir, err)
		}
		if replayed > 0 {
			logger.Info("replayed the journal", zap.Int("records", replayed))
		}
	}
	epoch, err := openFormat(db, logger, opts.LegacyAccounts)
	if err == nil {
		// The files Badger created while opening (LOCK, a memtable log).
		err = privateFiles(opts.Dir)
	}
	if err == nil {
		err = seedLastLive(db)
	}
	if err == nil && j != nil {
		// The replayed records and the new epoch, written to Badger
		// unsynced, become durable here.
		err = j.checkpoint(j.seq)
		j.last = [2]uint64{}
		if !journaled {
			if cerr := j.closeFiles(); err == nil {
				err = cerr
			}
			j = nil
		}
	}
	if err != nil {
		if j != nil {
			_ = j.closeFiles()
		}
		_ = db.Close()
		return nil, fmt.Errorf("badger database in %s: %w", opts.Dir, err)
	}
	b := &Badger{
		db:        db,
		log:       logger,
		maxBatch:  opts.MaxBatch,
		epoch:     epoch,
		owner:     ownerName(epoch),
		leaseTerm: max(opts.LeaseTerm, 0),
		hook:      opts.BeforeCommit,
		stopGC:    make(chan struct{}),
		gcDone:    make(chan struct{}),
		sweepDone: make(chan struct{}),
		journal:   j,
		leases:    newLeaseTracker(),
		fresh:     newFresh(),
		counters:  opts.Counters,
		selfCheck: opts.SelfCheck,
		gatherMax: opts.gatherMax,
	}
	// Whether a forward of an earlier open was cut, found here, before
	// serving: the scan steps over the deleted index entries of every
	// lease that open ended, which would otherwise stall the first claim.
	if err := db.View(func(txn *badger.Txn) error {
		b.leases.older = false
		return (&batch{txn: txn}).scan(leasePrefix, func(k []byte) bool {
			if e, _, _, ok := parseLeaseKey(k); ok && e < epoch {
				b.leases.older = true
			}
			return false
		})
	}); err != nil {
		if j != nil {
			_ = j.closeFiles()
		}
		_ = db.Close()
		return nil, fmt.Errorf("badger database in %s: %w", opts.Dir, err)
	}
	if err := db.View(func(txn *badger.Txn) error {
		var err error
		b.counts, err = readCounts(&batch{txn: txn})
		if err == nil {
			b.ages, err = countAges(&batch{txn: txn})
		}
		b.has = readPresence(&batch{txn: txn})
		return err
	}); err != nil {
		if j != nil {
			_ = j.closeFiles()
		}
		_ = db.Close()
		return nil, fmt.Errorf("badger database in %s: counting records: %w", opts.Dir, err)
	}
	b.space = space
	b.committer = store.NewCommitter(store.CommitterConfig[*op]{
		Commit:   b.commitBatch,
		MaxOps:   b.maxBatch,
		MaxBytes: maxBatchBytes,
		Size:     func(o *op) int { return o.size },
		Lazy:     func(o *op) bool { return o.lazy },
		LazyWait: lazyWait,
	})
	go b.gcLoop(opts.GCInterval)
	// Records that expired while the store was closed leave the counts
	// before it serves; the second swept up to is this open's now, or
	// the last sweep's if the clock has stepped back since.
	// No op has reached the committer yet: b.swept is this goroutine's.
	now := uint64(time.Now().Unix())
	if b.swept, err = readSwept(db); err == nil {
		b.swept = max(b.swept, now)
		if b.bucketDue(now) {
			err = b.sweepUntil(context.Background(), now)
		}
	}
	if errors.Is(err, store.ErrUnavailable) {
		// The disk is below min_free_space: the records that expired
		// stay counted until the sweep loop succeeds.
		logger.Warn("could not count out the records that expired while the store was closed; trying again each second", zap.Error(err))
		err = nil
	}
	if err == nil && b.selfCheck {
		err = b.checkCounts()
	}
	go b.sweepLoop()
	if err != nil {
		_ = b.Close()
		return nil, fmt.Errorf("badger database in %s: counting out expired records: %w", opts.Dir, err)
	}
	return b, nil
}

// Owner implements Store: "badger:<epoch>".
func (b *Badger) Owner() string { return b.owner }

// LeaseTerm implements Store.
func (b *Badger) LeaseTerm() time.Duration { return b.leaseTerm }

// Insert implements Store.
func (b *Badger) Insert(ctx context.Context, rec *store.Record) (store.InsertResult, error) {
	k := rec.Key()
	c := *rec
	if c.State == store.StateForwarding {
		c.Lease.Owner = b.owner
	} else {
		c.Lease = store.Lease{}
	}
	// Encode here, in the caller's goroutine, not in the committer's
	// serial section; only a tracked task (its submission time goes into
	// the record) needs a second encoding there.
	encoded, err := encodeRecord(&c)
	if err != nil {
		return store.InsertResult{}, fmt.Errorf("encoding record: %w", err)
	}
	if len(encoded) > store.MaxRecordSize {
		return store.InsertResult{}, fmt.Errorf("%w: %d bytes encoded, at most %d", store.ErrTooLarge, len(encoded), store.MaxRecordSize)
	}
	// A live forward's state as a read of it would decode it, for the
	// committer's fresh states ([fresh]); decoded here, outside
	// the serial section.
	var stored store.Delivery
	if c.State == store.StateForwarding {
		if err := decodeRecordDelivery(encoded, &stored); err != nil {
			return store.InsertResult{}, fmt.Errorf("decoding record: %w", err)
		}
	}
	var res store.InsertResult
	o := &op{size: len(encoded) + 256}
	o.apply = func(w *batch) error {
		res = store.InsertResult{}
		old, err := w.record(k)
		if err == nil {
			res.Existing = old
			return nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return err
		}
		purged := store.ErrNotFound
		if w.mayHoldTombstone() {
			_, purged = w.get(purgedKey(k))
		} else if w.selfCheck {
			w.checkAbsent(purgedKey(k))
		}
		switch err := purged; {
		case err == nil:
			// Purged: a duplicate of what was erased, never stored again.
			res = store.InsertResult{Existing: &store.Record{Provider: k.Provider, ID: k.ID, Code: c.Code}, Purged: true}
			if c.State == store.StateQuarantined {
				return nil
			}
			_, err := completeTask(w, k, c.ReceivedAt)
			return err
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		var sub time.Time
		if c.State != store.StateQuarantined {
			if sub, err = completeTask(w, k, c.ReceivedAt); err != nil {
				return err
			}
		}
		val := encoded
		if !sub.IsZero() {
			tracked := c
			tracked.SubmittedAt, tracked.Tracked = sub, true
			if val, err = encodeRecord(&tracked); err != nil {
				return fmt.Errorf("encoding record: %w", err)
			}
			if len(val) > store.MaxRecordSize {
				return fmt.Errorf("%w: %d bytes encoded, at most %d", store.ErrTooLarge, len(val), store.MaxRecordSize)
			}
		}
		exp := expiry(c.ExpiresAt)
		w.noteReceived(k, c.ReceivedAt)
		if c.Source == store.SourceCallback {
			w.liveAt = c.ReceivedAt
		}
		if c.State == store.StateForwarding {
			// A live forward: its delivery state is in the record, and
			// s/ is first written when it changes (the outcome), one
			// entry less per callback. A record stored in another state
			// needs its s/ now: it must outlive r/ for Expire to report it.
			w.moveIndexes(k, nil, &c.Delivery, exp)
			// The s/ of an earlier record under the key outlives its
			// r/ by expiryGrace (and an undelivered one until Expire
			// runs): it would hide this record's state. A blind
			// delete, no read.
			w.del(deliveryKey(k))
			w.added, w.freshKey = &freshState{d: stored, exp: exp}, k
		} else {
			w.writeDelivery(k, nil, &c.Delivery, exp, nil)
		}
		w.set(recordKey(k), val, exp)
		w.set(receivedIndexKey(k, c.ReceivedAt), nil, exp)
		res.SubmittedAt = sub
		return nil
	}
	if err := b.submit(ctx, o); err != nil {
		return store.InsertResult{}, err
	}
	return res, nil
}

// Get implements Store.
func (b *Badger) Get(ctx context.Context, key store.Key) (*store.Record, error) {
	var rec *store.Record
	err := b.view(func(txn *badger.Txn) error {
		var err error
		w := &batch{txn: txn}
		rec, err = w.record(key)
		if errors.Is(err, store.ErrNotFound) {
			if _, perr := w.get(purgedKey(key)); perr == nil {
				err = store.ErrPurged
			}
		}
		return err
	})
	return rec, err
}

// UpdateRecord implements Store.
func (b *Badger) UpdateRecord(ctx context.Context, key store.Key, fn func(*store.Record) error) (*store.Record, error) {
	var result *store.Record
	o := &op{size: 4096, apply: func(w *batch) error {
		old, cur, err := store.ApplyUpdate(func() (*store.Record, error) { return w.record(key) }, fn, store.KeepRecord(key, b.owner))
		result = old // what a failed update answers
		if err != nil {
			return err
		}
		if old.State == store.StateQuarantined && cur.State != store.StateQuarantined {
			sub, err := completeTask(w, key, cur.ReceivedAt)
			if err != nil {
				return err
			}
			if !sub.IsZero() {
				cur.SubmittedAt = sub
			}
		}
		val, err := encodeRecord(cur)
		if err != nil {
			return fmt.Errorf("encoding record: %w", err)
		}
		if len(val) > store.MaxRecordSize {
			return fmt.Errorf("%w: %d bytes encoded, at most %d", store.ErrTooLarge, len(val), store.MaxRecordSize)
		}
		exp := expiry(cur.ExpiresAt)
		if oldExp := expiry(old.ExpiresAt); oldExp != exp {
			// A correction of the expiry moves the record to its new
			// expiry bucket.
			w.countRecord(key.Provider, old.State, -1, oldExp)
			w.countRecord(key.Provider, old.State, 1, exp)
		}
		w.writeDelivery(key, &old.Delivery, &cur.Delivery, exp, nil)
		w.set(recordKey(key), val, exp)
		// The received-time index follows the record: a correction
		// moves its received time and its expiry.
		if oldIdx, newIdx := receivedIndexKey(key, old.ReceivedAt), receivedIndexKey(key, cur.ReceivedAt); string(oldIdx) != string(newIdx) {
			w.del(oldIdx)
		}
		w.set(receivedIndexKey(key, cur.ReceivedAt), nil, exp)
		result = cur
		return nil
	}}
	err := b.submit(ctx, o)
	return result, err
}

// UpdateDelivery implements Store.
func (b *Badger) UpdateDelivery(ctx context.Context, key store.Key, fn func(*store.Delivery) error) (store.Delivery, error) {
	var result store.Delivery
	o := &op{size: 512, lazy: store.IsDeferrable(ctx), apply: func(w *batch) error {
		old, exp, err := w.delivery(key)
		if err != nil {
			return err
		}
		result = old
		cur := old
		if err := fn(&cur); err != nil {
			return err
		}
		cur.OwnLease(b.owner)
		result = cur
		w.writeDelivery(key, &old, &cur, exp, nil)
		return nil
	}}
	err := b.submit(ctx, o)
	return result, err
}

// Claim implements Store. Its candidates are gathered by
// [Badger.claimable]: lapsed leases, fair claims, due records.
func (b *Badger) Claim(ctx context.Context, req store.ClaimRequest) ([]*store.Record, error) {
	if !req.Valid() {
		return nil, errors.New("claim: need a positive limit and a decide function")
	}
	var out []*store.Record
	o := &op{size: 512 * req.Limit, apply: func(w *batch) error {
		out = nil
		picks, err := b.claimable(w, req)
		if err != nil {
			return err
		}
		for _, c := range picks {
			rec, old := c.rec, c.old
			w.noteReceived(c.key, rec.ReceivedAt)
			cur := old
			if c.lapse != "" {
				cur.LastStatus, cur.LastError = 0, c.lapse
				cur.Lease = store.Lease{}
			}
			req.Apply(rec, &cur, c.lapse != "")
			if cur.State == store.StateForwarding {
				cur.Lease = store.Lease{Owner: b.owner, Until: req.Now.Add(req.Lease)}
			}
			cur.OwnLease(b.owner)
			w.writeDelivery(c.key, &old, &cur, c.exp, nil)
			rec.Delivery = cur
			out = append(out, rec)
		}
		return nil
	}}
	if err := b.submit(ctx, o); err != nil {
		return nil, err
	}
	return out, nil
}

// Renew implements Store.
func (b *Badger) Renew(ctx context.Context, key store.Key, attempt int, until time.Time) error {
	o := &op{size: 256, apply: func(w *batch) error {
		old, exp, err := w.delivery(key)
		if errors.Is(err, store.ErrNotFound) {
			return store.ErrLeaseLost
		}
		if err != nil {
			return err
		}
		if old.State != store.StateForwarding || old.Attempts != attempt || old.Lease.Owner != b.owner {
			return store.ErrLeaseLost
		}
		cur := old
		cur.Lease.Until = until
		w.writeDelivery(key, &old, &cur, exp, nil)
		return nil
	}}
	return b.submit(ctx, o)
}

// Expire implements Store: it walks the expiry watch (x/), written for
// every record that was ever left undelivered, and removes what is left
// of each record whose retention ended.
func (b *Badger) Expire(ctx context.Context, now time.Time, limit int) ([]store.Expired, error) {
	var out []store.Expired
	o := &op{size: 256 * limit, apply: func(w *batch) error {
		out = nil
		var keys [][]byte
		err := w.scan(expiryPrefix, func(k []byte) bool {
			at, _, ok := parseTimeKey(expiryPrefix, k)
			if ok && at.After(now) {
				return false
			}
			keys = append(keys, append([]byte(nil), k...))
			return len(keys) < limit
		})
		if err != nil {
			return err
		}
		for _, ik := range keys {
			at, key, ok := parseTimeKey(expiryPrefix, ik)
			if !ok {
				w.del(ik)
				continue
			}
			d, exp, err := w.delivery(key)
			if errors.Is(err, store.ErrNotFound) {
				w.del(ik)
				continue
			}
			if err != nil {
				return err
			}
			if exp != uint64(at.Unix()) {
				w.del(ik) // the watch of an earlier record under the key
				continue
			}
			rec, err := w.recordOnly(key)
			if err == nil && rec.ExpiresAt.After(now) {
				// The watch is kept to the second: this retention ends
				// later within it. Keep watching.
				continue
			}
			if err == nil {
				w.del(receivedIndexKey(key, rec.ReceivedAt))
			}
			w.del(ik)
			if d.State != store.StateDelivered {
				out = append(out, store.Expired{Key: key, State: d.State})
			}
			w.dropDelivery(key, &d, exp)
			w.del(recordKey(key))
		}
		return nil
	}}
	if err := b.submit(ctx, o); err != nil {
		return nil, err
	}
	return out, nil
}

// List implements Store. Queued, failed, rejected and parked records are
// found through their state index (v/), forwarding ones through their
// leases (l/): listing them costs what they are, however many delivered
// records the store holds. Other filters scan the records.
func (b *Badger) List(ctx context.Context, f store.Filter, limit int) ([]*store.Record, error) {
	switch {
	case indexedState(f.State):
		return b.listIndexed(ctx, f, limit)
	case f.State == store.StateForwarding:
		return b.listForwarding(ctx, f, limit)
	}
	prefix := recordPrefix
	if f.Provider != "" {
		prefix += f.Provider + "/"
	}
	var out []*store.Record
	err := b.view(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix), PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.Valid() && len(out) < limit; it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			rec := new(store.Record)
			if err := it.Item().Value(func(v []byte) error { return decodeRecord(v, rec) }); err != nil {
				return fmt.Errorf("decoding record %q: %w", it.Item().Key(), err)
			}
			if err := w.overlayDelivery(rec); err != nil {
				return err
			}
			if f.State == "" || rec.State == f.State {
				out = append(out, rec)
			}
		}
		return nil
	})
	return out, err
}

// listIndexed lists the records in an indexed state.
func (b *Badger) listIndexed(ctx context.Context, f store.Filter, limit int) ([]*store.Record, error) {
	prefix := statePrefix + string(f.State) + "/"
	if f.Provider != "" {
		prefix += f.Provider + "/"
	}
	var out []*store.Record
	err := b.view(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		var keys []store.Key
		if err := w.scan(prefix, func(k []byte) bool {
			if key, ok := parseTail(k[len(statePrefix)+len(f.State)+1:]); ok {
				keys = append(keys, key)
			}
			return ctx.Err() == nil
		}); err != nil {
			return err
		}
		return w.collect(ctx, keys, f.State, limit, &out)
	})
	return out, err
}

// listForwarding lists the records in flight, from their leases.
func (b *Badger) listForwarding(ctx context.Context, f store.Filter, limit int) ([]*store.Record, error) {
	var out []*store.Record
	err := b.view(func(txn *badger.Txn) error {
		w := &batch{txn: txn}
		var keys []store.Key
		if err := w.scan(leasePrefix, func(k []byte) bool {
			if _, _, key, ok := parseLeaseKey(k); ok && (f.Provider == "" || key.Provider == f.Provider) {
				keys = append(keys, key)
			}
			return ctx.Err() == nil
		}); err != nil {
			return err
		}
		slices.SortFunc(keys, func(a, b store.Key) int {
			return cmp.Or(cmp.Compare(a.Provider, b.Provider), cmp.Compare(a.ID, b.ID))
		})
		keys = slices.Compact(keys)
		return w.collect(ctx, keys, store.StateForwarding, limit, &out)
	})
	return out, err
}

// collect appends to out, in order, up to limit of the records under keys
// that are in state (an index entry may be stale).
func (w *batch) collect(ctx context.Context, keys []store.Key, state store.State, limit int, out *[]*store.Record) error {
	for _, k := range keys {
		if len(*out) >= limit {
			break
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rec, err := w.record(k)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if rec.State == state {
			*out = append(*out, rec)
		}
	}
	return nil
}

// Close implements Store: it refuses new operations, lets the committer
// finish every operation already submitted, then closes Badger.
func (b *Badger) Close() error {
	b.once.Do(func() {
		b.stopLoops()
		if b.journal != nil {
			// Badger holds every record: a checkpoint now leaves
			// nothing to replay at the next open.
			b.closeErr = b.journal.close()
		}
		if err := b.db.Close(); b.closeErr == nil {
			b.closeErr = err
		}
	})
	return b.closeErr
}

// stopLoops refuses new operations, lets the committer finish every
// operation already submitted and stops the loops.
func (b *Badger) stopLoops() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.committer.Close()
	close(b.stopGC)
	<-b.gcDone
	<-b.sweepDone
}

// submit hands o to the committer and waits until its batch is committed.
// The wait does not end early on ctx: once queued, the operation's fate is
// decided by the commit, and the caller must learn it.
func (b *Badger) submit(ctx context.Context, o *op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !b.space.available() {
		return store.ErrUnavailable
	}
	b.mu.RLock()
	closed := b.closed
	b.mu.RUnlock()
	if closed {
		return store.ErrClosed
	}
	o.done = make(chan struct{})
	if err := b.committer.Submit(o); err != nil {
		return err
	}
	<-o.done
	return o.err
}

// view runs fn in a read-only transaction unless the store is closed
// (Badger panics on iterators over a closed DB).
func (b *Badger) view(fn func(txn *badger.Txn) error) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return store.ErrClosed
	}
	return b.db.View(fn)
}

// maxBatchBytes ends the gathering of a batch at about 1 MiB of writes.
const maxBatchBytes = 1 << 20

// commitBatch is the committer's Commit: it commits the batch in one
// synced transaction, runs each op's after hook once the batch committed
// (no other batch commits meanwhile) and releases them all.
func (b *Badger) commitBatch(batch []*op) {
	b.commit(batch)
	for _, o := range batch {
		if o.after != nil && o.err == nil {
			o.err = o.after()
		}
		close(o.done)
	}
}

// commit runs ops in one transaction and commits it, setting each op's
// err. An op whose apply fails writes nothing. If the transaction grows too
// big it is discarded and the batch is split in halves, each committed on
// its own; if an op's writes fail half-way, the batch is run again without
// it. If the commit fails, every op of the batch fails with it: none of
// their answers is committed.
func (b *Badger) commit(ops []*op) {
	if len(ops) == 0 {
		return
	}
	txn, ts := b.db.begin()
	defer txn.Discard()
	writes := b.writes[:0]
	events := b.events[:0]
	counted := b.counted[:0]
	aged := b.aged[:0]
	b.cs.reset(b.swept)
	var live map[string]time.Time
	// dropped discards the transaction after a failed flush (and the
	// shortcuts that followed its writes); if it grew too big, the batch
	// is committed in halves instead, and dropped reports true.
	dropped := func(err error) bool {
		txn.Discard()
		b.fresh.clear()
		if errors.Is(err, badger.ErrTxnTooBig) && len(ops) > 1 {
			mid := len(ops) / 2
			b.commit(ops[:mid])
			b.commit(ops[mid:])
			return true
		}
		return false
	}
	w := &b.scratch
	for i, o := range ops {
		// One batch value for every operation, its buffers kept: what
		// each operation buffers is copied out below.
		w.reuse(batch{txn: txn, epoch: b.epoch, has: b.has, fresh: b.fresh, cs: &b.cs, selfCheck: b.selfCheck})
		if o.err = o.apply(w); o.err != nil {
			continue
		}
		writes = append(writes, w.writes...)
		events = append(events, w.leases...)
		counted = append(counted, w.counted...)
		aged = append(aged, w.aged...)
		if !w.liveAt.IsZero() {
			if live == nil {
				live = map[string]time.Time{}
			}
			if p := w.recvKey.Provider; w.liveAt.After(live[p]) && w.liveAt.After(b.ages.lastLive(p)) {
				live[p] = w.liveAt
			}
		}
		if err := w.flush(); err != nil {
			if dropped(err) {
				return
			}
			o.err = fmt.Errorf("writing: %w", err)
			rest := append(append(make([]*op, 0, len(ops)-1), ops[:i]...), ops[i+1:]...)
			b.commit(rest)
			return
		}
		// The shortcuts follow the operation's writes at once: the next
		// operation of the batch reads through them.
		b.has.note(w.writes)
		b.fresh.forget(w.writes)
		b.cs.note(w.counted)
		if w.added != nil {
			b.fresh.add(w.freshKey, w.added.d, w.added.exp)
		}
	}
	if len(live) > 0 {
		// The newest live pingback of each provider, once per commit.
		lw := &batch{txn: txn, writes: liveWrites(live)}
		if err := lw.flush(); err != nil {
			if dropped(err) {
				return
			}
			for _, o := range ops {
				o.err = fmt.Errorf("writing: %w", err)
			}
			return
		}
		writes = append(writes, lw.writes...)
	}
	// The counts the batch changed, persisted with it.
	cw, err := b.cs.countWrites(txn, counted, b.counts)
	if err == nil && len(cw) > 0 {
		err = (&batch{txn: txn, writes: cw}).flush()
	}
	if err != nil {
		if dropped(err) {
			return
		}
		for _, o := range ops {
			o.err = fmt.Errorf("writing counts: %w", err)
		}
		return
	}
	writes = append(writes, cw...)
	n := b.attempts.Add(1)
	if b.hook != nil {
		err = b.hook(n)
	}
	journaled := false
	if err == nil && b.journal != nil && len(writes) > 0 {
		_, err = b.journal.append(writes)
		journaled = err == nil
	}
	b.events = events[:0]
	if err == nil && journaled && b.loseCommit != nil && b.loseCommit() {
		b.fresh.clear()
		// The process goes on as after a commit (only Badger lost
		// it): the counts the next batches persist build on this
		// one's, in memory and in Badger (a real process loses
		// Badger's writes only by stopping). The counts are written
		// outside the transaction here, so a test of this hook
		// checks the records' replay, not the counts'.
		b.counts.apply(counted)
		b.swept = b.cs.swept
		if len(cw) > 0 {
			_ = b.db.Update(func(txn *badger.Txn) error { return (&batch{txn: txn, writes: cw}).flush() })
		}
		b.commits.Add(1)
		b.keepWrites(writes)
		return
	}
	if err == nil {
		if b.commitTxn != nil {
			err = b.commitTxn(func() error { return b.db.commit(txn, ts) }, writes)
		} else {
			err = b.db.commit(txn, ts)
		}
		if err != nil && journaled {
			// Badger may hold part of the batch: the record stays
			// for the next open's replay, and the store stops.
			b.journal.refused(err)
		}
	}
	b.keepWrites(writes)
	if err != nil {
		b.fresh.clear()
		if c := b.log.Check(zap.ErrorLevel, "group commit failed"); c != nil {
			c.Write(zap.Int("operations", len(ops)), zap.Error(err))
		}
		// Every op fails with the commit, even one whose apply failed
		// or wrote nothing: its answer (a duplicate, ErrSkip,
		// ErrNotFound, ErrLeaseLost) may rest on what an earlier op of
		// the batch wrote, which is now not committed.
		for _, o := range ops {
			o.err = fmt.Errorf("commit: %w", err)
		}
		return
	}
	b.leases.apply(events)
	b.counts.apply(counted)
	b.swept = b.cs.swept
	b.ages.apply(aged, live)
	if cap(counted) <= 4096 && cap(aged) <= 4096 {
		b.counted, b.aged = counted[:0], aged[:0]
	}
	b.keepScratch()
	b.commits.Add(1)
	b.counters.commits.Add(1)
	b.counters.ops.Add(uint64(len(ops)))
}

// keepScratch drops what the per-operation batch value still points to
// (the last operation's keys and values, the transaction) and its buffers
// if a rare huge operation grew them.
func (b *Badger) keepScratch() {
	w := &b.scratch
	if cap(w.writes) > 4096 || cap(w.leases) > 4096 || cap(w.counted) > 4096 || cap(w.aged) > 4096 {
		*w = batch{}
		return
	}
	w.reuse(batch{})
}

// keepWrites keeps the committer's write buffer for the next batch (not
// what it points to), unless a rare huge batch grew it.
func (b *Badger) keepWrites(writes []write) {
	if cap(writes) <= 4096 {
		clear(writes)
		b.writes = writes[:0]
	}
}

// Commits returns how many write transactions the committer has committed,
// each carrying one batch of operations. Tests use it to observe group
// commit; it is also a cheap health figure.
func (b *Badger) Commits() uint64 { return b.commits.Load() }

// gcLoop runs value-log GC periodically, as Badger asks of its users
// (https://pkg.go.dev/github.com/dgraph-io/badger/v4#DB.RunValueLogGC).
func (b *Badger) gcLoop(every time.Duration) {
	b.everyTick(every, b.gcDone, func() {
		for b.db.RunValueLogGC(0.5) == nil {
		}
	})
}

// everyTick runs fn every period until the store stops its loops, then
// closes done.
func (b *Badger) everyTick(period time.Duration, done chan struct{}, fn func()) {
	defer close(done)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-b.stopGC:
			return
		case <-t.C:
			fn()
		}
	}
}

// Interface guards
var _ store.Store = (*Badger)(nil)
