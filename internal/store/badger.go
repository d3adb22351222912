package store

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"go.uber.org/zap"
)

// Key layout (keys sort bytewise):
//
//	r/<provider>/<id>                      → JSON Record, as first stored
//	s/<provider>/<id>                      → JSON Delivery: the record's current delivery state
//	q/<8-byte big-endian DueAt unix ns><provider>/<id> → empty; the due index
//
// Both carry the record's ExpiresAt as Badger TTL.
const (
	recordPrefix   = "r/"
	deliveryPrefix = "s/"
	duePrefix      = "q/"
)

// BadgerOptions configures OpenBadger.
type BadgerOptions struct {
	// Dir is the database directory; created if missing. Required.
	Dir string
	// Logger receives Badger's own log lines (Info is demoted to Debug).
	// Nil discards them.
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
	// MinFreeSpace is the free space, in bytes, that the filesystem of
	// Dir must keep: below it every write fails with ErrUnavailable (see
	// freespace.go). 0 means DefaultMinFreeSpace; negative disables the
	// check (tests only: Badger then dies of SIGBUS on a full disk).
	MinFreeSpace int64
}

// Badger is the single-node Store on Badger v4, opened with SyncWrites so a
// commit returns only after the write-ahead log is msynced. Concurrent
// writes are group-committed: one committer goroutine gathers every waiting
// operation into one transaction, commits it once and then releases all
// their callers with the commit's result.
type Badger struct {
	db       *badger.DB
	log      *zap.Logger
	maxBatch int

	ops      chan *op
	mu       sync.RWMutex // guards closed; held for reading while submitting
	closed   bool
	inflight sync.WaitGroup
	done     chan struct{} // closed when the committer exits
	stopGC   chan struct{}
	gcDone   chan struct{}
	closeErr error
	once     sync.Once
	commits  atomic.Uint64 // transactions committed successfully
	space    *spaceGuard   // nil: free space is not checked
}

// op is one unit of work for the committer. apply runs inside the batch's
// transaction and must be re-runnable: it may be called again on a fresh
// transaction if the batch has to be split.
type op struct {
	apply func(txn *badger.Txn) error
	err   error // apply's own result
	// readOnly is set by apply when it wrote nothing: such an op does
	// not learn of a failed commit (a duplicate insert's answer, the
	// existing record, stands whatever happens to the batch).
	readOnly bool
	done     chan struct{}
	size     int // approximate bytes written, for batching
}

// OpenBadger opens (or creates) the database in opts.Dir with memory-lean
// options (see badger-and-distributed-stores.md §3 and §6) and starts its
// committer. A directory locked by another process is retried for
// opts.LockWait, then reported with guidance.
func OpenBadger(opts BadgerOptions) (*Badger, error) {
	if opts.Dir == "" {
		return nil, errors.New("badger: no directory")
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
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating storage directory: %w", err)
	}
	bopts := badger.DefaultOptions(opts.Dir).
		WithSyncWrites(true).
		WithLogger(newBadgerLogger(opts.Logger)).
		WithMemTableSize(16 << 20).
		WithNumMemtables(2).
		WithNumLevelZeroTables(2).
		WithNumLevelZeroTablesStall(8).
		WithBlockCacheSize(16 << 20).
		WithIndexCacheSize(16 << 20).
		WithValueLogFileSize(64 << 20).
		WithNumCompactors(2)

	var db *badger.DB
	var err error
	deadline := time.Now().Add(opts.LockWait)
	for {
		db, err = badger.Open(bopts)
		if err == nil {
			break
		}
		// Badger formats the lock error with %+v, so errors.Is cannot
		// see it; match the text (badger dir_unix.go, dir_windows.go).
		locked := strings.Contains(err.Error(), "Another process is using this Badger database")
		if !locked {
			return nil, fmt.Errorf("opening badger database in %s: %w", opts.Dir, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("badger database in %s is locked by another process; if Caddy is already running, use 'caddy reload' instead of starting a second instance on the same storage_dir: %w", opts.Dir, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	logger := opts.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	b := &Badger{
		db:       db,
		log:      logger,
		maxBatch: opts.MaxBatch,
		ops:      make(chan *op, opts.MaxBatch),
		done:     make(chan struct{}),
		stopGC:   make(chan struct{}),
		gcDone:   make(chan struct{}),
	}
	if opts.MinFreeSpace == 0 {
		opts.MinFreeSpace = DefaultMinFreeSpace
	}
	b.space = newSpaceGuard(opts.Dir, opts.MinFreeSpace, logger, nil)
	go b.commitLoop()
	go b.gcLoop(opts.GCInterval)
	return b, nil
}

// Insert implements Store.
func (b *Badger) Insert(ctx context.Context, rec *Record) (*Record, error) {
	key := recordKey(rec.Key())
	// Encode here, in the caller's goroutine, not in the committer's
	// serial section; only a tracked task (completeTask fills in
	// SubmittedAt) needs a second encoding there.
	encodedSub := rec.SubmittedAt
	encoded, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encoding record: %w", err)
	}
	delivery := rec.Delivery()
	encodedDelivery, err := json.Marshal(delivery)
	if err != nil {
		return nil, fmt.Errorf("encoding delivery: %w", err)
	}
	var existing *Record
	o := &op{size: len(rec.Request.Body) + len(rec.Code) + 1024}
	o.apply = func(txn *badger.Txn) error {
		existing, o.readOnly = nil, false
		old, err := getRecord(txn, key)
		if err == nil {
			existing, o.readOnly = old, true
			return nil
		}
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		if err := completeTask(txn, rec); err != nil {
			return err
		}
		val := encoded
		if !rec.SubmittedAt.Equal(encodedSub) {
			if val, err = json.Marshal(rec); err != nil {
				return fmt.Errorf("encoding record: %w", err)
			}
		}
		exp := uint64(rec.ExpiresAt.Unix())
		if err := writeDelivery(txn, rec.Key(), nil, &delivery, exp, encodedDelivery); err != nil {
			return err
		}
		return setRecord(txn, rec.Key(), val, exp)
	}
	if err := b.submit(ctx, o); err != nil {
		return nil, err
	}
	return existing, nil
}

// Get implements Store.
func (b *Badger) Get(ctx context.Context, key Key) (*Record, error) {
	var rec *Record
	err := b.view(func(txn *badger.Txn) error {
		var err error
		rec, err = getRecord(txn, recordKey(key))
		return err
	})
	return rec, err
}

// Update implements Store.
func (b *Badger) Update(ctx context.Context, key Key, fn func(*Record) error) (*Record, error) {
	k := recordKey(key)
	var result *Record
	o := &op{size: 4096, apply: func(txn *badger.Txn) error {
		result = nil
		old, err := getRecord(txn, k)
		if err != nil {
			return err
		}
		// A private copy for fn to change: cheaper than decoding the
		// record twice in the committer's serial section.
		cur := old.clone()
		if err := fn(cur); err != nil {
			result = old
			return err
		}
		val, err := json.Marshal(cur)
		if err != nil {
			return fmt.Errorf("encoding record: %w", err)
		}
		result = cur
		return writeRecord(txn, old, cur, val)
	}}
	err := b.submit(ctx, o)
	return result, err
}

// UpdateDelivery implements Store.
func (b *Badger) UpdateDelivery(ctx context.Context, key Key, fn func(*Delivery) error) (Delivery, error) {
	var result Delivery
	o := &op{size: 512, apply: func(txn *badger.Txn) error {
		item, err := txn.Get(deliveryKey(key))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		var old Delivery
		if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &old) }); err != nil {
			return fmt.Errorf("decoding delivery of %s: %w", key, err)
		}
		result = old
		cur := old
		if err := fn(&cur); err != nil {
			return err
		}
		result = cur
		return writeDelivery(txn, key, &old, &cur, item.ExpiresAt(), nil)
	}}
	err := b.submit(ctx, o)
	return result, err
}

// Due implements Store.
func (b *Badger) Due(ctx context.Context, now time.Time, limit int) ([]*Record, error) {
	var out []*Record
	err := b.view(func(txn *badger.Txn) error {
		return scanIndex(ctx, txn, duePrefix, now, limit, func(tail []byte) error {
			rec, err := getRecord(txn, append([]byte(recordPrefix), tail...))
			if errors.Is(err, ErrNotFound) {
				return nil // expired with its index entry racing behind
			}
			if err != nil {
				return err
			}
			out = append(out, rec)
			return nil
		})
	})
	return out, err
}

// List implements Store.
func (b *Badger) List(ctx context.Context, f Filter, limit int) ([]*Record, error) {
	prefix := recordPrefix
	if f.Provider != "" {
		prefix += f.Provider + "/"
	}
	var out []*Record
	err := b.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix), PrefetchValues: true, PrefetchSize: 100})
		defer it.Close()
		for it.Rewind(); it.Valid() && len(out) < limit; it.Next() {
			if err := ctx.Err(); err != nil {
				return err
			}
			rec := new(Record)
			if err := it.Item().Value(func(v []byte) error { return json.Unmarshal(v, rec) }); err != nil {
				return fmt.Errorf("decoding record %q: %w", it.Item().Key(), err)
			}
			if err := overlayDelivery(txn, rec); err != nil {
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

// scanIndex calls fn with the "<provider>/<id>" tail of each entry of the
// time index under prefix whose time is at or before now, earliest first,
// until limit calls.
func scanIndex(ctx context.Context, txn *badger.Txn, prefix string, now time.Time, limit int, fn func(tail []byte) error) error {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix)})
	defer it.Close()
	for it.Rewind(); it.Valid() && limit > 0; it.Next() {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := it.Item().Key()
		if len(k) < len(prefix)+8 {
			continue
		}
		if int64(binary.BigEndian.Uint64(k[len(prefix):])) > now.UnixNano() {
			break
		}
		if err := fn(k[len(prefix)+8:]); err != nil {
			return err
		}
		limit--
	}
	return nil
}

// Close implements Store: it refuses new operations, lets the committer
// finish every operation already submitted, then closes Badger.
func (b *Badger) Close() error {
	b.once.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		b.inflight.Wait()
		close(b.ops)
		<-b.done
		close(b.stopGC)
		<-b.gcDone
		b.closeErr = b.db.Close()
	})
	return b.closeErr
}

// submit hands o to the committer and waits until its batch is committed.
// The wait does not end early on ctx: once queued, the operation's fate is
// decided by the commit, and the caller must learn it.
func (b *Badger) submit(ctx context.Context, o *op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !b.space.available() {
		return ErrUnavailable
	}
	b.mu.RLock()
	if b.closed {
		b.mu.RUnlock()
		return ErrClosed
	}
	b.inflight.Add(1)
	b.mu.RUnlock()
	o.done = make(chan struct{})
	b.ops <- o
	b.inflight.Done()
	<-o.done
	return o.err
}

// view runs fn in a read-only transaction unless the store is closed
// (Badger panics on iterators over a closed DB).
func (b *Badger) view(fn func(txn *badger.Txn) error) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return ErrClosed
	}
	return b.db.View(fn)
}

// commitLoop is the group committer: it blocks for one operation, takes
// every other one already waiting (up to maxBatch or about 1 MiB), commits
// them in one synced transaction and releases them all.
func (b *Badger) commitLoop() {
	defer close(b.done)
	const maxBytes = 1 << 20
	batch := make([]*op, 0, b.maxBatch)
	for first := range b.ops {
		batch = append(batch[:0], first)
		size := first.size
	gather:
		for len(batch) < b.maxBatch && size < maxBytes {
			select {
			case o, ok := <-b.ops:
				if !ok {
					break gather
				}
				batch = append(batch, o)
				size += o.size
			default:
				break gather
			}
		}
		b.commit(batch)
		for _, o := range batch {
			close(o.done)
		}
	}
}

// commit runs ops in one transaction and commits it, setting each op's err.
// If the transaction grows too big it is discarded and the batch is split
// in halves, each committed on its own.
func (b *Badger) commit(ops []*op) {
	txn := b.db.NewTransaction(true)
	defer txn.Discard()
	for _, o := range ops {
		o.err = o.apply(txn)
		if errors.Is(o.err, badger.ErrTxnTooBig) {
			if len(ops) == 1 {
				return // a single op too big for a txn: report it as is
			}
			txn.Discard()
			mid := len(ops) / 2
			b.commit(ops[:mid])
			b.commit(ops[mid:])
			return
		}
	}
	if err := txn.Commit(); err != nil {
		if c := b.log.Check(zap.ErrorLevel, "group commit failed"); c != nil {
			c.Write(zap.Int("operations", len(ops)), zap.Error(err))
		}
		for _, o := range ops {
			if o.err == nil && !o.readOnly {
				o.err = fmt.Errorf("commit: %w", err)
			}
		}
		return
	}
	b.commits.Add(1)
}

// Commits returns how many write transactions the committer has committed,
// each carrying one batch of operations. Tests use it to observe group
// commit; it is also a cheap health figure.
func (b *Badger) Commits() uint64 { return b.commits.Load() }

// gcLoop runs value-log GC periodically (badger docs/quickstart.md).
func (b *Badger) gcLoop(every time.Duration) {
	defer close(b.gcDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-b.stopGC:
			return
		case <-t.C:
			for b.db.RunValueLogGC(0.5) == nil {
			}
		}
	}
}

func recordKey(k Key) []byte {
	return []byte(recordPrefix + k.Provider + "/" + k.ID)
}

func dueKey(at time.Time, k Key) []byte { return indexKey(duePrefix, at, k) }

// indexKey is prefix, at as 8 big-endian bytes of Unix nanoseconds (so keys
// sort by time), then "<provider>/<id>".
func indexKey(prefix string, at time.Time, k Key) []byte {
	b := make([]byte, 0, len(prefix)+8+len(k.Provider)+1+len(k.ID))
	b = append(b, prefix...)
	b = binary.BigEndian.AppendUint64(b, uint64(at.UnixNano()))
	return append(b, k.Provider+"/"+k.ID...)
}

func getRecord(txn *badger.Txn, key []byte) (*Record, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	rec := new(Record)
	err = item.Value(func(v []byte) error { return json.Unmarshal(v, rec) })
	if err != nil {
		return nil, fmt.Errorf("decoding record %q: %w", key, err)
	}
	return rec, overlayDelivery(txn, rec)
}

// overlayDelivery sets rec's delivery state from its s/ key, the current
// one (the copy inside r/ is the state at insert).
func overlayDelivery(txn *badger.Txn, rec *Record) error {
	item, err := txn.Get(deliveryKey(rec.Key()))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var d Delivery
	if err := item.Value(func(v []byte) error { return json.Unmarshal(v, &d) }); err != nil {
		return fmt.Errorf("decoding delivery of %s: %w", rec.Key(), err)
	}
	rec.SetDelivery(d)
	return nil
}

func deliveryKey(k Key) []byte { return []byte(deliveryPrefix + k.Provider + "/" + k.ID) }

// writeRecord stores rec (already encoded as val) and moves its due index
// entry from old's DueAt to rec's.
func writeRecord(txn *badger.Txn, old, rec *Record, val []byte) error {
	exp := uint64(rec.ExpiresAt.Unix())
	var oldD *Delivery
	if old != nil {
		d := old.Delivery()
		oldD = &d
	}
	d := rec.Delivery()
	if err := writeDelivery(txn, rec.Key(), oldD, &d, exp, nil); err != nil {
		return err
	}
	return setRecord(txn, rec.Key(), val, exp)
}

// setRecord stores the encoded record under its r/ key.
func setRecord(txn *badger.Txn, k Key, val []byte, exp uint64) error {
	e := badger.NewEntry(recordKey(k), val)
	e.ExpiresAt = exp
	return txn.SetEntry(e)
}

// writeDelivery stores the delivery state d of key (val: d already
// encoded, or nil) and moves its due index entry from old's DueAt (old is nil
// for a new record). exp is the record's expiry, Unix seconds.
func writeDelivery(txn *badger.Txn, k Key, old, d *Delivery, exp uint64, val []byte) error {
	if old != nil && !old.DueAt.IsZero() && !old.DueAt.Equal(d.DueAt) {
		if err := txn.Delete(dueKey(old.DueAt, k)); err != nil {
			return err
		}
	}
	if !d.DueAt.IsZero() {
		e := badger.NewEntry(dueKey(d.DueAt, k), nil)
		e.ExpiresAt = exp
		if err := txn.SetEntry(e); err != nil {
			return err
		}
	}
	if val == nil {
		var err error
		if val, err = json.Marshal(d); err != nil {
			return fmt.Errorf("encoding delivery: %w", err)
		}
	}
	e := badger.NewEntry(deliveryKey(k), val)
	e.ExpiresAt = exp
	return txn.SetEntry(e)
}

// Interface guards
var _ Store = (*Badger)(nil)
