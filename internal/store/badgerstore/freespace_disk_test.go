package badgerstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/testfs"
)

// diskRecord is a test record with a 2 KiB random body, about 3.5 KiB
// stored: big enough to use up space quickly, far below ValueThreshold.
func diskRecord(t testing.TB, id string) *store.Record {
	t.Helper()
	r := testRecord(id, store.StateForwarding)
	r.Request.Body = make([]byte, 2048)
	if _, err := rand.Read(r.Request.Body); err != nil {
		t.Fatal(err)
	}
	return r
}

// eventually polls cond every 10 ms until it holds or d has passed.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		<-tick.C
	}
}

// checkStored fails unless every record in want is stored as written.
func checkStored(t *testing.T, b *Badger, want map[string]*store.Record) {
	t.Helper()
	ctx := context.Background()
	for id, w := range want {
		got, err := b.Get(ctx, key(id))
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		if got.Code != w.Code || !bytes.Equal(got.Request.Body, w.Request.Body) {
			t.Fatalf("record %s changed: code %q, want %q", id, got.Code, w.Code)
		}
	}
}

// On a filesystem that fills up, the store refuses writes with
// ErrUnavailable before Badger runs out of room (so nothing crashes), keeps
// answering reads, and takes writes again once space is freed, with every
// record stored before intact, also after a reopen.
func TestBadgerFullDiskUnavailable(t *testing.T) {
	dir := testfs.Small(t, DefaultMinFreeSpace+48<<20)
	dbDir := filepath.Join(dir, "db")
	core, logs := observer.New(zapcore.WarnLevel)
	// MinFreeSpace 0: the default, DefaultMinFreeSpace. The filesystem
	// has room for Badger's growth plus the smallest journal (two files
	// preallocated at open, which never grow).
	b, err := openChecked(Options{Dir: dbDir, Logger: zap.New(core), JournalSize: minJournalSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()

	stored := map[string]*store.Record{}
	insert := func(id string) error {
		r := diskRecord(t, id)
		res, err := b.Insert(ctx, r)
		if err == nil {
			if res.Existing != nil {
				t.Fatalf("insert %s: duplicate", id)
			}
			stored[id] = r
		}
		return err
	}
	for i := range 50 {
		if err := insert(fmt.Sprintf("before-%d", i)); err != nil {
			t.Fatalf("insert with the disk empty: %v", err)
		}
	}
	if !b.Available() {
		t.Fatal("unavailable with the disk empty")
	}

	// Another process fills the disk to 1 MiB above the threshold; the
	// store's own writes take it below.
	freeFiller := testfs.Fill(t, dir, DefaultMinFreeSpace+1<<20)
	n, refusedID := 0, ""
	for ; n < 20000; n++ {
		id := fmt.Sprintf("fill-%d", n)
		err := insert(id)
		if errors.Is(err, store.ErrUnavailable) {
			refusedID = id
			break
		}
		if err != nil {
			t.Fatalf("insert %d while filling: %v", n, err)
		}
	}
	if refusedID == "" {
		t.Fatalf("%d inserts on a filesystem with %d bytes free and no store.ErrUnavailable", n, testfs.Free(t, dir))
	}
	free := testfs.Free(t, dir)
	t.Logf("unavailable after %d inserts; %d bytes free (min_free_space %d)", n, free, DefaultMinFreeSpace)
	if free >= DefaultMinFreeSpace {
		t.Fatalf("store.ErrUnavailable with %d bytes free, not below %d", free, DefaultMinFreeSpace)
	}

	// Now the disk fills to the last block: the store still refuses
	// writes and does not crash, and reads work.
	stillFree := testfs.Fill(t, dir, 0)
	if _, err := b.Get(ctx, key(refusedID)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused record: get = %v, want ErrNotFound", err)
	}
	for i := range 20 {
		if err := insert(fmt.Sprintf("refused-%d", i)); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("insert on a full disk: %v, want store.ErrUnavailable", err)
		}
	}
	if _, err := b.Claim(ctx, store.ClaimRequest{Now: time.Now(), Limit: 1, Keys: []store.Key{key("before-0")}, Decide: func(*store.Delivery, bool) {}}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("claim on a full disk: %v, want store.ErrUnavailable", err)
	}
	if _, err := b.UpdateDelivery(ctx, key("before-0"), func(*store.Delivery) error { return nil }); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("update delivery on a full disk: %v, want store.ErrUnavailable", err)
	}
	if _, err := b.AddTask(ctx, &store.Task{Provider: "captchaai", ID: "t1", State: store.TaskPending, ExpiresAt: time.Now().Add(time.Hour)}); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("add task on a full disk: %v, want store.ErrUnavailable", err)
	}
	if b.Available() {
		t.Fatal("Available() is true on a full disk")
	}
	checkStored(t, b, stored)
	if recs, err := b.List(ctx, store.Filter{}, 1<<20); err != nil || len(recs) != len(stored) {
		t.Fatalf("list on a full disk: %d records, %v; want %d", len(recs), err, len(stored))
	}
	down := logs.FilterMessageSnippet("storage unavailable").All()
	if len(down) != 1 || down[0].Level != zapcore.ErrorLevel || !strings.Contains(down[0].Message, "mounted at "+dir) {
		t.Fatalf("unavailability logged as %v; want one error line naming %s", entries(down), dir)
	}

	// Space returns: writes resume by themselves.
	stillFree()
	freeFiller()
	eventually(t, 5*time.Second, "insert after space was freed", func() bool {
		err := insert("after-0")
		if err != nil && !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("insert after space was freed: %v", err)
		}
		return err == nil
	})
	for i := 1; i < 20; i++ {
		if err := insert(fmt.Sprintf("after-%d", i)); err != nil {
			t.Fatalf("insert after recovery: %v", err)
		}
	}
	if !b.Available() {
		t.Fatal("Available() is false after recovery")
	}
	up := logs.FilterMessageSnippet("storage available again").All()
	if len(up) != 1 {
		t.Fatalf("recovery logged %d times, want once", len(up))
	}
	checkStored(t, b, stored)

	// And it all survives a reopen.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2 := openTestBadger(t, Options{Dir: dbDir, JournalSize: minJournalSize})
	checkStored(t, b2, stored)
	t.Logf("%d records intact after the full disk and a reopen", len(stored))
}

// sigbusChildEnv names the directory a child process of
// TestBadgerSIGBUSWithoutGuard fills; set only in the child.
const sigbusChildEnv = "PINGBACK_TEST_SIGBUS_DIR"

// Why the guard exists: without it (MinFreeSpace negative), a store on a
// full disk does not get an error back; Badger's write goroutine touches an
// unallocated page of its memory-mapped WAL and the kernel's SIGBUS ends the
// whole process. The crash runs in a child process (this test binary run
// again with sigbusChildEnv set), so only the child dies.
func TestBadgerSIGBUSWithoutGuard(t *testing.T) {
	if dir := os.Getenv(sigbusChildEnv); dir != "" {
		sigbusChild(t, dir)
		return
	}
	dir := testfs.Small(t, 64<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBadgerSIGBUSWithoutGuard$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), sigbusChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("child: %v, want it to die\n%s", err, tail(out))
	}
	if !bytes.Contains(out, []byte("signal SIGBUS")) {
		if bytes.Contains(out, []byte("CHILD SURVIVED")) {
			t.Fatalf("Badger no longer dies of SIGBUS on a full disk; the reason for the free-space guard has changed:\n%s", tail(out))
		}
		t.Fatalf("child died (%v), but not of SIGBUS:\n%s", err, tail(out))
	}
	// Where it died: the memtable WAL (Badger's (*logFile).writeEntry) is
	// the first mapped file a small write touches.
	where := "somewhere in Badger"
	if bytes.Contains(out, []byte("(*logFile).writeEntry")) {
		where = "in (*logFile).writeEntry, Badger's memtable WAL"
	}
	t.Logf("as expected, the unguarded store died of SIGBUS %s (%v):\n%s", where, exit, head(out))
}

// sigbusChild opens an unguarded store on dir, fills the disk to 256 KiB
// free and inserts until something happens. It is expected never to
// return: SIGBUS kills the process.
func sigbusChild(t *testing.T, dir string) {
	b, err := openChecked(Options{Dir: filepath.Join(dir, "db"), MinFreeSpace: -1, JournalSize: minJournalSize})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	testfs.Fill(t, dir, 256<<10)
	fmt.Printf("child: %d bytes free; inserting\n", testfs.Free(t, dir))
	for i := range 100000 {
		if _, err := b.Insert(context.Background(), diskRecord(t, fmt.Sprint(i))); err != nil {
			fmt.Printf("CHILD SURVIVED: insert %d: %v\n", i, err)
			return
		}
	}
	fmt.Println("CHILD SURVIVED: 100000 inserts")
}

// head and tail shorten a child's output for a log line.
func head(out []byte) string { return string(out[:min(len(out), 1500)]) }
func tail(out []byte) string { return string(out[max(0, len(out)-3000):]) }
