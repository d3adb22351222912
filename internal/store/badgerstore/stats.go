package badgerstore

import (
	"sync/atomic"
	"time"
)

// Counters count the durable write path of the Badger stores that share
// them: group commits, the operations they carried, the journal's syncs and
// checkpoints, and the syncs' durations. Safe for concurrent use; the zero
// value is ready. A store counts into [Options.Counters], or into counters
// of its own when that is nil ([Badger.Stats] reads them either way).
type Counters struct {
	commits, ops, syncs, checkpoints, checkpointFailures atomic.Uint64
	syncTime                                             durations
}

// Stats are the figures of [Counters] at one moment.
type Stats struct {
	// Commits counts group commits that succeeded; Ops the operations
	// they carried (Ops/Commits is the mean batch size).
	Commits, Ops uint64
	// Syncs counts completed fdatasyncs of the journal: every
	// acknowledged write was in a journal record synced before its
	// caller was answered. Checkpoints counts completed checkpoints,
	// CheckpointFailures failed ones (each also logged at error level;
	// the store reports itself unavailable until one succeeds).
	Syncs, Checkpoints, CheckpointFailures uint64
	// SyncSeconds counts the journal's writes and syncs (pwrite and
	// fdatasync of one group commit) by duration: SyncSeconds[i] took at
	// most SyncBuckets()[i] seconds, the last one longer than all.
	SyncSeconds []uint64
	// SyncSum is the total of those durations, in seconds.
	SyncSum float64
}

// Stats returns the counters' figures now.
func (c *Counters) Stats() Stats {
	out := Stats{
		Commits:            c.commits.Load(),
		Ops:                c.ops.Load(),
		Syncs:              c.syncs.Load(),
		Checkpoints:        c.checkpoints.Load(),
		CheckpointFailures: c.checkpointFailures.Load(),
		SyncSeconds:        make([]uint64, len(c.syncTime.n)),
		SyncSum:            time.Duration(c.syncTime.sum.Load()).Seconds(),
	}
	for i := range out.SyncSeconds {
		out.SyncSeconds[i] = c.syncTime.n[i].Load()
	}
	return out
}

// Stats returns the figures of the counters b counts into (see
// [Options.Counters]).
func (b *Badger) Stats() Stats { return b.counters.Stats() }

// syncBuckets are the upper bounds, in seconds, of Stats.SyncSeconds.
var syncBuckets = [...]float64{50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 1}

// SyncBuckets returns the upper bounds, in seconds, of Stats.SyncSeconds
// (a copy: 12 bounds from 50 µs to 1 s; SyncSeconds has one more count,
// for longer syncs).
func SyncBuckets() []float64 { return append([]float64(nil), syncBuckets[:]...) }

// durations counts durations into syncBuckets.
type durations struct {
	n   [len(syncBuckets) + 1]atomic.Uint64
	sum atomic.Int64 // ns
}

func (d *durations) observe(t time.Duration) {
	i := 0
	for i < len(syncBuckets) && t.Seconds() > syncBuckets[i] {
		i++
	}
	d.n[i].Add(1)
	d.sum.Add(int64(t))
}
