package badgerstore

import (
	"context"
	"encoding/binary"
	"maps"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/dgraph-io/badger/v4"
)

// rawPrefix returns the keys and values under prefix in b.
func rawPrefix(t *testing.T, b *Badger, prefix string) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := b.view(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix), PrefetchValues: true})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				return err
			}
			out[string(it.Item().KeyCopy(nil))] = string(v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func mustCounts(t *testing.T, b *Badger) map[string]map[store.State]int64 {
	t.Helper()
	c, err := b.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c.Records
}

func sameCounts(a, b map[string]map[store.State]int64) bool {
	return maps.EqualFunc(a, b, func(x, y map[store.State]int64) bool { return maps.Equal(x, y) })
}

// TestBadgerCountsPersisted: the record counts an open finds are the ones
// the last open left, after every kind of change, whether the store was
// closed cleanly, crashed with its journal to replay, or was written by
// format 7 (which kept no counts: the upgrade counts the record keys once).
func TestBadgerCountsPersisted(t *testing.T) {
	fill := func(t *testing.T, b *Badger) {
		t.Helper()
		mustInsert(t, b,
			testRecord("q1", store.StateQueued), testRecord("q2", store.StateQueued), testRecord("f1", store.StateFailed),
			testRecord("p1", store.StateParked), testRecord("d1", store.StateDelivered), testRecord("w1", store.StateForwarding),
			testRecord("w2", store.StateForwarding), testRecord("gone", store.StateDelivered))
		other := testRecord("x1", store.StateDelivered)
		other.Provider = "2captcha"
		mustInsert(t, b, other)
		if _, err := b.UpdateDelivery(ctx, key("w1"), delivered); err != nil { // a live outcome
			t.Fatal(err)
		}
		claimAt(t, b, t0, 1, key("q1"))                                           // queued → forwarding
		if _, err := b.UpdateRecord(ctx, key("d1"), func(r *store.Record) error { // a later expiry
			r.ExpiresAt = r.ExpiresAt.Add(time.Hour)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if n, err := b.Purge(ctx, store.PurgeQuery{Keys: []store.Key{key("gone")}}); err != nil || n != 1 {
			t.Fatalf("purge = %d, %v", n, err)
		}
	}
	want := map[string]map[store.State]int64{
		"captchaai": {store.StateQueued: 1, store.StateFailed: 1, store.StateParked: 1, store.StateDelivered: 2, store.StateForwarding: 2},
		"2captcha":  {store.StateDelivered: 1},
	}
	for _, x := range []struct {
		name  string
		close func(t *testing.T, b *Badger, dir string)
	}{
		{"close", func(t *testing.T, b *Badger, dir string) {
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"crash", func(t *testing.T, b *Badger, dir string) { b.crash() }},
		{"format 7", func(t *testing.T, b *Badger, dir string) {
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			// The layout of format 7: the same keys without m/count/ and e/.
			if n := dropRaw(t, dir, countPrefix); n != 6 {
				t.Fatalf("the store held %d m/count/ keys, want 6", n)
			}
			// One bucket per provider, state and expiry second:
			// queued, failed, parked, forwarding and delivered at 30
			// days, d1's an hour later, and 2captcha's.
			if n := dropRaw(t, dir, bucketPrefix); n != 7 {
				t.Fatalf("the store held %d e/ keys, want 7", n)
			}
			setRaw(t, dir, metaFormatKey, "7")
		}},
	} {
		t.Run(x.name, func(t *testing.T) {
			dir := t.TempDir()
			b := openTestBadger(t, journalOpts(dir))
			fill(t, b)
			if got := mustCounts(t, b); !sameCounts(got, want) {
				t.Fatalf("counts before the reopen = %v, want %v", got, want)
			}
			stored := rawPrefix(t, b, countPrefix)
			buckets := rawPrefix(t, b, bucketPrefix)
			x.close(t, b, dir)

			b = openTestBadger(t, journalOpts(dir))
			if got := mustCounts(t, b); !sameCounts(got, want) {
				t.Errorf("counts after the reopen = %v, want %v", got, want)
			}
			if v, err := storedFormat(b.db); err != nil || v != formatVersion {
				t.Errorf("stored format = %d, %v; want %d", v, err, formatVersion)
			}
			if got := rawPrefix(t, b, countPrefix); !maps.Equal(got, stored) {
				t.Errorf("m/count/ after the reopen = %q, want %q", got, stored)
			}
			if got := rawPrefix(t, b, bucketPrefix); !maps.Equal(got, buckets) {
				t.Errorf("e/ after the reopen = %q, want %q", got, buckets)
			}
			checkIndexesOK(t, b)
		})
	}
}

// TestBadgerCountsLeaveAtExpiry: a record leaves its state's count when
// its retention ends (Badger drops it by its TTL, with no operation of the
// store), whatever its state, not at the next open; what Expire removes
// afterwards, even after a reopen, is not counted out a second time; a key
// stored again after its record expired counts once. Badger's TTLs follow
// the real clock, in seconds: the test waits for them, about two seconds.
func TestBadgerCountsLeaveAtExpiry(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	soon := time.Now().Add(time.Second)
	expiring := func(id string, st store.State) *store.Record {
		r := testRecord(id, st)
		r.ExpiresAt = soon
		return r
	}
	mustInsert(t, b,
		expiring("live", store.StateForwarding),  // a live forward, then its outcome
		expiring("replayed", store.StateQueued),  // undelivered first: in the expiry watch
		expiring("stuck", store.StateQueued),     // never delivered: Expire reports it
		expiring("cut", store.StateForwarding),   // a forward that never ended
		testRecord("kept", store.StateDelivered)) // retention ends in 30 days
	for _, id := range []string{"live", "replayed"} {
		if _, err := b.UpdateDelivery(ctx, key(id), delivered); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]map[store.State]int64{"captchaai": {store.StateDelivered: 3, store.StateQueued: 1, store.StateForwarding: 1}}
	if got := mustCounts(t, b); !sameCounts(got, want) {
		t.Fatalf("counts = %v, want %v", got, want)
	}

	want = map[string]map[store.State]int64{"captchaai": {store.StateDelivered: 1}}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !sameCounts(mustCounts(t, b), want) {
		select {
		case <-ctx.Done():
			t.Fatalf("counts 10 s after the records expired: %v, want %v (kept only)", mustCounts(t, b), want)
		case <-tick.C:
		}
	}
	if _, err := b.Get(ctx, key("live")); err == nil {
		t.Error("live left the delivered count but is still stored")
	}
	// Expire after a reopen: the new open's sweep state must still know
	// these records are counted out.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTestBadger(t, journalOpts(dir))
	if got := mustCounts(t, b); !sameCounts(got, want) {
		t.Errorf("counts after a reopen = %v, want %v", got, want)
	}
	expired, err := b.Expire(ctx, time.Now(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(expired) != 1 || expired[0].Key != key("stuck") || expired[0].State != store.StateQueued {
		t.Errorf("Expire = %+v, want stuck (queued) only", expired)
	}
	if got := mustCounts(t, b); !sameCounts(got, want) {
		t.Errorf("counts after Expire = %v, want %v", got, want)
	}
	// The key of an expired record, stored again.
	mustInsert(t, b, testRecord("cut", store.StateQueued))
	want = map[string]map[store.State]int64{"captchaai": {store.StateDelivered: 1, store.StateQueued: 1}}
	if got := mustCounts(t, b); !sameCounts(got, want) {
		t.Errorf("counts after cut is stored again = %v, want %v", got, want)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b = openTestBadger(t, journalOpts(dir)) // SelfCheck compares with the keys
	if got := mustCounts(t, b); !sameCounts(got, want) {
		t.Errorf("counts after the last reopen = %v, want %v", got, want)
	}
	if got := len(rawPrefix(t, b, bucketPrefix)); got != 2 {
		t.Errorf("%d expiry buckets after the sweep, want 2 (kept's, cut's)", got)
	}
}

// closedWithKept returns the directory of a closed store holding one
// delivered record, kept.
func closedWithKept(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	b := openTestBadger(t, journalOpts(dir))
	mustInsert(t, b, testRecord("kept", store.StateDelivered))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// setRawMany sets every key of kv in the Badger database in dir, in one
// transaction.
func setRawMany(t *testing.T, dir string, kv map[string][]byte) {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	wb := db.NewWriteBatch()
	for k, v := range kv {
		if err := wb.Set([]byte(k), v); err != nil {
			t.Fatal(err)
		}
	}
	if err := wb.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestBadgerCountsSweptAtOpen: records whose retention ended while the
// store was closed are out of the counts as soon as it opens again, before
// its first sweep tick, however many seconds' worth are due (more than one
// sweep operation takes); a malformed bucket key does not stop the sweep.
func TestBadgerCountsSweptAtOpen(t *testing.T) {
	dir := closedWithKept(t)
	// What a store closed for a while holds: the buckets of delivered
	// and parked records that expired since, one per second, and them
	// in the counts.
	due := 2*sweepChunk + 500
	kv := map[string][]byte{}
	now := uint64(time.Now().Unix())
	for i := range due {
		kv[string(bucketKey{sec: now - 1 - uint64(i), provider: "captchaai", state: store.StateDelivered}.key())] = binary.BigEndian.AppendUint64(nil, 1)
		kv[string(bucketKey{sec: now - 1 - uint64(i), provider: "captchaai", state: store.StateParked}.key())] = binary.BigEndian.AppendUint64(nil, 2)
	}
	kv[string(countKey("captchaai", store.StateDelivered))] = binary.BigEndian.AppendUint64(nil, uint64(1+due))
	kv[string(countKey("captchaai", store.StateParked))] = binary.BigEndian.AppendUint64(nil, uint64(2*due))
	kv[bucketPrefix+"\x00"] = binary.BigEndian.AppendUint64(nil, 1) // malformed, first of e/: deleted
	setRawMany(t, dir, kv)

	b := openTestBadger(t, journalOpts(dir))
	want := map[string]map[store.State]int64{"captchaai": {store.StateDelivered: 1}}
	if got := mustCounts(t, b); !sameCounts(got, want) {
		t.Errorf("counts at open = %v, want %v", got, want)
	}
	if got := len(rawPrefix(t, b, bucketPrefix)); got != 1 {
		t.Errorf("%d expiry buckets after the open, want 1 (kept's)", got)
	}
}

// TestBadgerSweptKeptAcrossClockStepBack: an open takes the second the
// last sweep reached if the wall clock is now behind it (a step back across
// a restart), so that what that sweep counted out is not counted out again.
func TestBadgerSweptKeptAcrossClockStepBack(t *testing.T) {
	dir := closedWithKept(t)
	ahead := uint64(time.Now().Unix()) + 3600
	setRaw(t, dir, sweptKey, string(binary.BigEndian.AppendUint64(nil, ahead)))
	b := openTestBadger(t, journalOpts(dir))
	if b.swept != ahead {
		t.Errorf("swept after the open = %d, want the stored %d", b.swept, ahead)
	}
}
