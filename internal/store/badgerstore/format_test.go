package badgerstore

import (
	"encoding/binary"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testfs"
)

// untarFormat1 unpacks testdata/store-format1.tar.gz, a store written by
// format 1 (main at a90f74c), into a new directory and returns it. The
// store holds 2captcha results 101 delivered, 102 failed (3 attempts, last
// status 503, due 2026-11-30T13:00Z), 103 forwarding (cut by a crash), 104
// parked (20 attempts), 105 rejected (422) and the pending task 106, all
// expiring 2036-01-01.
func untarFormat1(t *testing.T) string {
	t.Helper()
	return testfs.Unpack(t, filepath.Join("..", "..", "..", "testdata", "store-format1.tar.gz"), "format1")
}

var (
	f1Received = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f1Due102   = time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC)
	f1Poll106  = time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC)
	f1Expires  = time.Date(2036, 1, 1, 0, 0, 0, 0, time.UTC)
)

func f1Key(id string) store.Key { return store.Key{Provider: "2captcha", ID: id} }

// checkFormat1Records checks what the records of the format 1 store read
// back as once upgraded, and returns them by id.
func checkFormat1Records(t *testing.T, b *Badger) map[string]*store.Record {
	t.Helper()
	want := map[string]store.Delivery{
		"101": {State: store.StateDelivered, Attempts: 1, UpdatedAt: f1Received},
		"102": {State: store.StateFailed, Attempts: 3, Failures: 3, DueAt: f1Due102, LastStatus: 503, LastError: "app answered 503", UpdatedAt: f1Received},
		"103": {State: store.StateForwarding, Attempts: 1, UpdatedAt: f1Received},
		"104": {State: store.StateParked, Attempts: 20, Failures: 20, LastStatus: 502, LastError: "dial tcp: connection refused", UpdatedAt: f1Received},
		"105": {State: store.StateRejected, Attempts: 1, LastStatus: 422, LastError: "app answered 422", UpdatedAt: f1Received},
	}
	out := map[string]*store.Record{}
	for id, wd := range want {
		r := mustGet(t, b, f1Key(id))
		out[id] = r
		d := r.Delivery
		if d.State != wd.State || d.Attempts != wd.Attempts || d.Failures != wd.Failures || d.Interrupts != 0 ||
			!d.DueAt.Equal(wd.DueAt) || d.LastStatus != wd.LastStatus || d.LastError != wd.LastError || !d.UpdatedAt.Equal(wd.UpdatedAt) {
			t.Errorf("%s: delivery %+v, want %+v", id, d, wd)
		}
		// 103 was cut by a crash: its lease is one of no open that lives.
		if id == "103" && ownerEpoch(d.Lease.Owner) >= b.epoch {
			t.Errorf("103: lease %+v, want one that lapsed", d.Lease)
		}
		if id != "103" && d.Lease != (store.Lease{}) {
			t.Errorf("%s: lease %+v, want none", id, d.Lease)
		}
		if r.Code != "CODE-"+id || string(r.Request.Body) != "id="+id+"&code=CODE-"+id ||
			r.Request.Method != "POST" || r.Request.URI != "/pingback/2captcha" || r.Request.Host != "localhost" ||
			r.Request.Header.Get("User-Agent") != "fixture" || r.Server != "srv0" || r.Source != store.SourceCallback ||
			!r.ReceivedAt.Equal(f1Received) || !r.ExpiresAt.Equal(f1Expires) {
			t.Errorf("%s: record %+v", id, r)
		}
	}
	recs, err := b.List(ctx, store.Filter{Provider: "2captcha"}, 10)
	if err != nil || recIDs(recs) != "101,102,103,104,105" {
		t.Errorf("List = %q, %v; want 101..105", recIDs(recs), err)
	}
	task, err := b.GetTask(ctx, f1Key("106"))
	if err != nil {
		t.Fatal(err)
	}
	if task.State != store.TaskPending || !task.NextPollAt.Equal(f1Poll106) || !task.SubmittedAt.Equal(f1Received) || task.Method != "userrecaptcha" {
		t.Errorf("task 106: %+v", task)
	}
	checkIndexesOK(t, b)
	return out
}

func TestBadgerFormat1(t *testing.T) {
	dir := untarFormat1(t)
	b := openTestBadger(t, Options{Dir: dir})
	first := checkFormat1Records(t, b)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	// Opening the upgraded store again changes nothing but the epoch.
	b = openTestBadger(t, Options{Dir: dir})
	if b.epoch != 2 {
		t.Errorf("second open: epoch %d, want 2", b.epoch)
	}
	again := checkFormat1Records(t, b)
	for id, r := range first {
		if !reflect.DeepEqual(r.Delivery, again[id].Delivery) {
			t.Errorf("%s changed on reopening: %+v, then %+v", id, r.Delivery, again[id].Delivery)
		}
	}

	// The task is due at its poll time.
	for _, x := range []struct {
		now  time.Time
		want int
	}{{f1Poll106.Add(-time.Second), 0}, {f1Poll106, 1}} {
		if ts, err := b.DueTasks(ctx, store.DueQuery{Now: x.now, Limit: 10, Accounts: []store.Account{{Provider: "2captcha"}}}); err != nil || len(ts) != x.want {
			t.Errorf("DueTasks(%s) = %d tasks, %v; want %d", x.now, len(ts), err, x.want)
		}
	}
	// 103's forward was cut: it is claimed at once, as lapsed, long
	// before 102 is due.
	claim := func(now time.Time) []*store.Record {
		t.Helper()
		recs, err := b.Claim(ctx, store.ClaimRequest{Now: now, Limit: 10, Lease: 2 * time.Hour, Decide: forward})
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}
	recs := claim(f1Received)
	if recIDs(recs) != "103" {
		t.Fatalf("first claim = %q, want 103", recIDs(recs))
	}
	r := recs[0]
	if r.LastError != store.LapseRestart || r.LastStatus != 0 || r.Interrupts != 1 || r.Attempts != 2 || r.Lease.Owner != b.Owner() {
		t.Errorf("103 claimed as %+v; want lapsed by restart (interrupt 1), attempt 2, leased to %s", r.Delivery, b.Owner())
	}
	if got := recIDs(claim(f1Due102.Add(-time.Second))); got != "" {
		t.Errorf("claim before 102 is due = %q, want none", got)
	}
	recs = claim(f1Due102)
	if recIDs(recs) != "102" || recs[0].Attempts != 4 || recs[0].Failures != 3 || recs[0].Interrupts != 0 {
		t.Errorf("claim when 102 is due = %q %+v; want 102, attempt 4, not lapsed", recIDs(recs), recs)
	}
	checkIndexesOK(t, b)
}

// TestBadgerFormat1Expire: the upgrade puts every undelivered record on the
// expiry watch, so that its retention's end is reported.
func TestBadgerFormat1Expire(t *testing.T) {
	b := openTestBadger(t, Options{Dir: untarFormat1(t)})
	if gone, err := b.Expire(ctx, f1Expires.Add(-time.Second), 100); err != nil || len(gone) != 0 {
		t.Errorf("Expire a second before the end = %v, %v; want none", gone, err)
	}
	gone, err := b.Expire(ctx, f1Expires, 100)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]store.State{}
	for _, e := range gone {
		got[e.Key.ID] = e.State
	}
	want := map[string]store.State{"102": store.StateFailed, "104": store.StateParked, "105": store.StateRejected}
	if len(got) != len(want) {
		t.Errorf("Expire at the end = %v, want %v", got, want)
	}
	for id, st := range want {
		if got[id] != st {
			t.Errorf("Expire at the end = %v, want %v", got, want)
		}
	}
}

// TestBadgerFormat1MigrationRerun: the upgrade runs again if the process
// stops before it has written the format key (a large store is upgraded in
// several transactions). Running it again over what it already rewrote
// must not move expiries or counters.
func TestBadgerFormat1MigrationRerun(t *testing.T) {
	dir := untarFormat1(t)
	db, err := openManaged(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := migrateFormat1(db); err != nil {
			t.Fatal(err)
		}
		if _, err := buildReceivedIndex(db); err != nil {
			t.Fatal(err)
		}
		if _, _, err := upgradeTaskIndexes(db, map[string]string{"2captcha": "00000000000000f1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := buildFairIndex(db); err != nil {
			t.Fatal(err)
		}
		if _, err := persistCounts(db); err != nil {
			t.Fatal(err)
		}
	}
	err = db.View(func(txn *badger.Txn) error { return checkIndexes(txn) })
	if cerr := db.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Errorf("after the upgrade ran twice: %v", err)
	}
	b := openTestBadger(t, Options{Dir: dir}) // and a third time
	checkFormat1Records(t, b)
	if task, err := b.GetTask(ctx, f1Key("106")); err != nil || task.Account != "00000000000000f1" {
		t.Errorf("task 106 after the upgrade ran twice: %+v, %v; want account 00000000000000f1", task, err)
	}
}

// TestBadgerFormat5: a store of format 5 had no fair claims index (f/);
// opening it builds the index from its due records, and fair claims find
// a record with few failures behind older records with many.
func TestBadgerFormat5(t *testing.T) {
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	failed := func(id string, failures int, due time.Time) *store.Record {
		r := testRecord(id, store.StateFailed)
		r.Attempts, r.Failures, r.DueAt = failures, failures, due
		return r
	}
	mustInsert(t, b,
		failed("f5", 5, t0.Add(-3*time.Second)),
		failed("f4", 4, t0.Add(-2*time.Second)),
		failed("f1", 1, t0.Add(-time.Second)),
		testRecord("q0", store.StateQueued),
		failed("later", 1, t0.Add(time.Hour)),
		testRecord("done", store.StateDelivered),
	)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// The layout of format 5: the same keys without f/.
	if n := dropRaw(t, dir, fairPrefix); n != 3 {
		t.Fatalf("the store of format 6 held %d f/ entries, want 3 (f1, q0, later)", n)
	}
	setRaw(t, dir, metaFormatKey, "5")

	b = openTestBadger(t, Options{Dir: dir})
	checkIndexesOK(t, b) // every f/ entry the records call for, and no other
	if v, err := storedFormat(b.db); err != nil || v != formatVersion {
		t.Errorf("stored format after the upgrade: %d, %v; want %d", v, err, formatVersion)
	}
	claim := func(reserved int) string {
		t.Helper()
		recs, err := b.Claim(ctx, store.ClaimRequest{Now: t0, Limit: 2, Reserved: reserved, Lease: time.Minute, Decide: forward})
		if err != nil {
			t.Fatal(err)
		}
		return recIDs(recs)
	}
	if got := claim(1); got != "f1,f5" {
		t.Errorf("fair claim after the upgrade = %q, want f1,f5 (the one failure first, then the oldest)", got)
	}
	if got := claim(1); got != "q0,f4" {
		t.Errorf("second fair claim = %q, want q0,f4", got)
	}
	if got := claim(1); got != "" {
		t.Errorf("third fair claim = %q, want none (later is not due)", got)
	}
	checkIndexesOK(t, b)
}

// dropRaw deletes every key under prefix in the Badger database in dir and
// returns how many there were.
func dropRaw(t *testing.T, dir, prefix string) int {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	err = db.Update(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(prefix)})
		var keys [][]byte
		for it.Rewind(); it.Valid(); it.Next() {
			keys = append(keys, it.Item().KeyCopy(nil))
		}
		it.Close()
		n = len(keys)
		for _, k := range keys {
			if err := txn.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestBadgerFormatNewer(t *testing.T) {
	for _, x := range []struct{ format, want string }{
		{"9", "stored format 9 is newer than this plugin's (8)"},
		{"two", `format key "two"`},
	} {
		t.Run(x.format, func(t *testing.T) {
			dir := t.TempDir()
			b := openTestBadger(t, Options{Dir: dir})
			mustInsert(t, b, testRecord("a", store.StateQueued))
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			setRaw(t, dir, metaFormatKey, x.format)
			b, err := openChecked(Options{Dir: dir, LockWait: time.Millisecond})
			if err == nil {
				_ = b.Close()
				t.Fatal("Open of a store of an unknown format succeeded")
			}
			if !strings.Contains(err.Error(), x.want) || !strings.Contains(err.Error(), dir) {
				t.Errorf("Open: %v; want it to name the directory and say %q", err, x.want)
			}
			// The refused open released the directory and wrote nothing.
			setRaw(t, dir, metaFormatKey, "3")
			b = openTestBadger(t, Options{Dir: dir})
			if b.epoch != 2 {
				t.Errorf("epoch after the refused open: %d, want 2 (the refused open took none)", b.epoch)
			}
			mustGet(t, b, key("a"))
		})
	}
}

// setRaw sets key to val in the Badger database in dir.
func setRaw(t *testing.T, dir, key, val string) {
	t.Helper()
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(txn *badger.Txn) error { return txn.Set([]byte(key), []byte(val)) }); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// toFormat6 rewrites the tasks of the store in dir (none with an account)
// in the layout of format 6: t/ values without the appended account, the
// poll index p/<NextPollAt><provider>/<id> and the task order
// o/<state>/<provider>/<SubmittedAt><id>, with the tasks' TTLs; and sets
// the stored format to 6.
func toFormat6(t *testing.T, dir string) {
	t.Helper()
	dropRaw(t, dir, pollPrefix)
	dropRaw(t, dir, taskOrderPrefix)
	db, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(txn *badger.Txn) error {
		type kv struct {
			k, v []byte
			exp  uint64
		}
		var tasks []kv
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(taskPrefix), PrefetchValues: true})
		for it.Rewind(); it.Valid(); it.Next() {
			v, err := it.Item().ValueCopy(nil)
			if err != nil {
				it.Close()
				return err
			}
			tasks = append(tasks, kv{it.Item().KeyCopy(nil), v, it.Item().ExpiresAt()})
		}
		it.Close()
		set := func(k, v []byte, exp uint64) error {
			e := badger.NewEntry(k, v)
			e.ExpiresAt = exp
			return txn.SetEntry(e)
		}
		for _, x := range tasks {
			var tk store.Task
			if err := decodeTask(x.v, &tk); err != nil {
				return err
			}
			if tk.Account != "" || x.v[len(x.v)-1] != 0 {
				return fmt.Errorf("task %s has an account", tk.Key())
			}
			if err := set(x.k, x.v[:len(x.v)-1], x.exp); err != nil { // the empty account: one byte
				return err
			}
			if tk.State == store.TaskPending && !tk.NextPollAt.IsZero() {
				if err := set(timeKey(pollPrefix, tk.NextPollAt, tk.Key()), nil, x.exp); err != nil {
					return err
				}
			}
			ok := []byte(taskOrderPrefix + string(tk.State) + "/" + tk.Provider + "/")
			ok = append(binary.BigEndian.AppendUint64(ok, store.UnixNano(tk.SubmittedAt)), tk.ID...)
			if err := set(ok, nil, x.exp); err != nil {
				return err
			}
		}
		return txn.Set([]byte(metaFormatKey), []byte("6"))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestBadgerFormat6Accounts: opening a store of format 6 stamps its tasks
// with LegacyAccounts (a provider missing from the map keeps its tasks
// without account), moves the poll index and the task order to their
// runs by account, and counts the pending tasks by account; a later open
// with another map changes nothing.
func TestBadgerFormat6Accounts(t *testing.T) {
	const acct = "0123456789abcdef"
	dir := t.TempDir()
	b := openTestBadger(t, Options{Dir: dir})
	sub := t0.Add(-time.Hour)
	for _, x := range []struct {
		p, id string
		st    store.TaskState
		next  time.Time
	}{
		{"2captcha", "p1", store.TaskPending, t0.Add(time.Second)},
		{"2captcha", "p2", store.TaskPending, t0.Add(2 * time.Second)},
		{"2captcha", "d1", store.TaskDone, time.Time{}},
		{"2captcha", "e1", store.TaskExpired, time.Time{}},
		{"captchaai", "q1", store.TaskPending, t0},
	} {
		tk := &store.Task{Provider: x.p, ID: x.id, SubmittedAt: sub, PingbackURL: "https://example.com/cb", State: x.st,
			NextPollAt: x.next, UpdatedAt: sub, ExpiresAt: t0.Add(24 * time.Hour)}
		if _, err := b.AddTask(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	// More than two of the upgrade's chunks of 500, added at once.
	const many = 1100
	var wg sync.WaitGroup
	for i := range many {
		wg.Go(func() {
			tk := &store.Task{Provider: "2captcha", ID: fmt.Sprintf("m%04d", i), SubmittedAt: sub, PingbackURL: "https://example.com/cb",
				State: store.TaskPending, NextPollAt: t0.Add(time.Hour), UpdatedAt: sub, ExpiresAt: t0.Add(24 * time.Hour)}
			if _, err := b.AddTask(ctx, tk); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	mustInsert(t, b, testRecord("r1", store.StateQueued))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	toFormat6(t, dir)
	if v, err := openManagedFormat(t, dir); err != nil || v != 6 {
		t.Fatalf("the store before the upgrade: format %d, %v; want 6", v, err)
	}

	check := func(b *Badger, when string) {
		t.Helper()
		checkIndexesOK(t, b) // no p/ or o/ key of format 6 is left
		if v, err := storedFormat(b.db); err != nil || v != formatVersion {
			t.Errorf("%s: stored format %d, %v; want %d", when, v, err, formatVersion)
		}
		for id, want := range map[string]string{"p1": acct, "p2": acct, "d1": acct, "e1": acct} {
			if tk, err := b.GetTask(ctx, store.Key{Provider: "2captcha", ID: id}); err != nil || tk.Account != want || tk.PingbackURL != "https://example.com/cb" {
				t.Errorf("%s: task %s = %+v, %v; want account %q", when, id, tk, err, want)
			}
		}
		if tk, err := b.GetTask(ctx, key("q1")); err != nil || tk.Account != "" {
			t.Errorf("%s: task q1 of captchaai (not in the map) = %+v, %v; want no account", when, tk, err)
		}
		due := func(accts ...store.Account) string {
			t.Helper()
			ts, err := b.DueTasks(ctx, store.DueQuery{Now: t0.Add(time.Minute), Limit: 10, Accounts: accts})
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, tk := range ts {
				ids = append(ids, tk.ID)
			}
			return strings.Join(ids, ",")
		}
		if ts, err := b.DueTasks(ctx, store.DueQuery{Now: t0.Add(2 * time.Hour), Limit: 2 * many, Accounts: []store.Account{{Provider: "2captcha", ID: acct}}}); err != nil || len(ts) != 2+many {
			t.Errorf("%s: %d due tasks of 2captcha/%s in two hours, %v; want %d", when, len(ts), acct, err, 2+many)
		}
		if got := due(store.Account{Provider: "2captcha", ID: acct}); got != "p1,p2" {
			t.Errorf("%s: due tasks of 2captcha/%s = %q, want p1,p2", when, acct, got)
		}
		if got := due(store.Account{Provider: "2captcha"}); got != "" {
			t.Errorf("%s: due tasks of 2captcha without account = %q, want none", when, got)
		}
		if got := due(store.Account{Provider: "captchaai"}, store.Account{Provider: "2captcha", ID: acct}); got != "q1,p1,p2" {
			t.Errorf("%s: due tasks of both = %q, want q1,p1,p2", when, got)
		}
		page, err := b.ListTaskPage(ctx, store.TaskQuery{Account: acct, State: store.TaskDone, Limit: 10})
		if err != nil || len(page.Tasks) != 1 || page.Tasks[0].ID != "d1" {
			t.Errorf("%s: ListTaskPage(account, done) = %+v, %v; want d1", when, page.Tasks, err)
		}
		c, err := b.Counts(ctx)
		want := map[string]map[string]int64{"2captcha": {acct: 2 + many}, "captchaai": {"": 1}}
		if err != nil || !maps.EqualFunc(c.TasksPendingByAccount, want, maps.Equal) ||
			c.TasksPending["2captcha"] != 2+many || c.TasksPending["captchaai"] != 1 {
			t.Errorf("%s: counts %+v, %v; want pending by account %v", when, c, err, want)
		}
		mustGet(t, b, key("r1"))
	}
	b = openTestBadger(t, Options{Dir: dir, LegacyAccounts: map[string]string{"2captcha": acct}})
	check(b, "upgraded")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// The stamp is given once: a later open's map is not applied.
	b = openTestBadger(t, Options{Dir: dir, LegacyAccounts: map[string]string{"2captcha": "ffffffffffffffff", "captchaai": "ffffffffffffffff"}})
	check(b, "opened again")
}

// openManagedFormat reads the stored format of the closed store in dir.
func openManagedFormat(t *testing.T, dir string) (int, error) {
	t.Helper()
	db, err := openManaged(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	return storedFormat(db)
}
