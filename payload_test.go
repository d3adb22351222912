package pingback

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// payloadKeep is the keep_payload of the erasure tests.
const payloadKeep = time.Hour

// TestKeepPayloadBadger and TestKeepPayloadPostgres: keep_payload after
// its delivery, a result's payload is erased from the store (Badger on
// disk, PostgreSQL) and the admin API says so; a result not delivered
// keeps its payload; a re-delivery of the erased result is a plain
// duplicate that reaches nothing; the app's res.php for it goes to the
// provider; a forced replay and a release get 409 with the reason.
func TestKeepPayloadBadger(t *testing.T) {
	testKeepPayload(t, func(cf string) string { return cf })
}

func TestKeepPayloadPostgres(t *testing.T) {
	dsn := pgtest.DSN(t)
	schema := pgtest.Schema(t, dsn)
	testKeepPayload(t, func(cf string) string {
		i := strings.Index(cf, "storage_dir ")
		end := i + strings.Index(cf[i:], "\n")
		return cf[:i] + fmt.Sprintf("store postgres {\n\t\t\tdsn %q\n\t\t\tschema %s\n\t\t}", dsn, schema) + cf[end:]
	})
}

func testKeepPayload(t *testing.T, withStore func(caddyfile string) string) {
	sim, err := captchasim.New(captchasim.Config{Seed: 36, SolveMin: time.Hour, SolveMax: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(func() { srv.Close(); sim.Close() })
	app := newAppStub(t)
	global := "storage_dir " + t.TempDir() + "\n\t\tkeep_payload " + payloadKeep.String() + "\n\t\t" + trkGlobal
	loadCaddyfile(t, withStore(caddyfileFor(global, trkSite("pingback_url "+trkCallbackURL, srv.URL, app))))
	t.Cleanup(func() { unloadCaddy(t) })
	a := runningApp(t)
	st := a.store(time.Second)

	submit := func() string {
		t.Helper()
		resp := trkDo(t, http.MethodGet, "/in.php?key="+captchasim.DefaultKey+"&method=userrecaptcha&googlekey=k&pageurl=https://example.com/&json=1", "", nil)
		var ans struct {
			Status  int    `json:"status"`
			Request string `json:"request"`
		}
		if err := json.Unmarshal(resp.body, &ans); err != nil || ans.Status != 1 {
			t.Fatalf("submission: got %d %q, want a JSON task id", resp.status, resp.body)
		}
		return ans.Request
	}
	kept, rejected := submit(), submit()
	app.Tune(func() {
		app.StatusFor = func(r *http.Request) int {
			if r.Header.Get(HeaderIdempotencyKey) == "2captcha:"+rejected {
				return http.StatusUnprocessableEntity
			}
			return http.StatusOK
		}
	})
	for _, id := range []string{kept, rejected} {
		if !sim.Solve(id) {
			t.Fatalf("simulator could not solve %s", id)
		}
	}
	settled := func(id string, want store.State) *store.Record {
		t.Helper()
		var rec *store.Record
		testkit.WaitFor(t, 5*time.Second, id+" to be "+string(want), func() bool {
			r, err := st.Get(context.Background(), store.Key{Provider: "2captcha", ID: id})
			rec = r
			return err == nil && r.State == want
		})
		return rec
	}
	delivered := settled(kept, store.StateDelivered)
	settled(rejected, store.StateRejected)
	code := delivered.Code
	if code == "" || !strings.Contains(delivered.Request.URI, "?") || len(delivered.Request.Body) == 0 || len(delivered.Request.Header) == 0 {
		t.Fatalf("delivered record before erasure: %+v; want its code, query, body and headers", delivered)
	}

	clock := testkit.NewClock(delivered.UpdatedAt)
	clock.Advance(payloadKeep - time.Second)
	a.erasePayloads(st, clock.Now())
	if rec := getRecord(t, "2captcha", kept); rec.PayloadErased || rec.Code != code {
		t.Fatalf("a second before keep_payload ran out: erased %v, code %q; want the payload kept", rec.PayloadErased, rec.Code)
	}
	clock.Advance(time.Second)
	a.erasePayloads(st, clock.Now())

	rec := getRecord(t, "2captcha", kept)
	if !rec.PayloadErased || rec.Code != "" || rec.Answer != nil || rec.Request.Body != nil || rec.Request.Header != nil || rec.Request.URI != "/cb" {
		t.Errorf("stored record keep_payload after its delivery: erased %v, code %q, answer %q, body %q, header %v, uri %q; want the payload gone",
			rec.PayloadErased, rec.Code, rec.Answer, rec.Request.Body, rec.Request.Header, rec.Request.URI)
	}
	if rec.State != store.StateDelivered || rec.Attempts != 1 || rec.LastStatus != http.StatusOK || !rec.ReceivedAt.Equal(delivered.ReceivedAt) || len(rec.History) != 1 {
		t.Errorf("stored record after erasure: %+v; want its state, attempts, status, times and history kept", rec)
	}
	if rec := getRecord(t, "2captcha", rejected); rec.PayloadErased || rec.Code == "" || len(rec.Request.Body) == 0 {
		t.Errorf("rejected (undelivered) record: erased %v, code %q; want its payload kept for the whole retention", rec.PayloadErased, rec.Code)
	}

	// The admin API says so, and shows no code.
	status, body := adminDo(t, http.MethodGet, "/pingback/records/2captcha/"+kept, "")
	var shown map[string]any
	if err := json.Unmarshal(body, &shown); status != http.StatusOK || err != nil || shown["payload_erased"] != true || shown["code"] != "" {
		t.Errorf("admin record: %d %s; want payload_erased true and no code", status, body)
	}
	if bytes.Contains(body, []byte(code)) {
		t.Errorf("admin record still shows the code: %s", body)
	}

	// A re-delivery is a plain duplicate: answered 200, nothing forwarded.
	dups := a.metrics.callbacks.WithLabelValues("2captcha", "duplicate")
	before := testutil.ToFloat64(dups)
	trkPingback(t, kept, code)
	trkPingback(t, kept, "another-code")
	if got := testutil.ToFloat64(dups) - before; got != 2 {
		t.Errorf("callbacks_total{duplicate} rose by %v, want 2", got)
	}
	if n := app.Count("2captcha:" + kept); n != 1 {
		t.Errorf("app got %s %d times, want once (before the erasure)", kept, n)
	}
	if rec := getRecord(t, "2captcha", kept); rec.Code != "" || rec.OtherCode != "" || rec.State != store.StateDelivered {
		t.Errorf("record after duplicates: code %q, other %q, state %s; want nothing stored again", rec.Code, rec.OtherCode, rec.State)
	}

	// The app's res.php goes to the provider, which answers.
	calls := sim.Stats().ResCalls
	resp := trkDo(t, http.MethodGet, "/res.php?key="+captchasim.DefaultKey+"&action=get&id="+kept, "", nil)
	if resp.status != http.StatusOK || string(resp.body) != "OK|"+code {
		t.Errorf("res.php for the erased result: %d %q, want the provider's OK|%s", resp.status, resp.body, code)
	}
	if got := sim.Stats().ResCalls - calls; got != 1 {
		t.Errorf("the provider got %d res.php calls, want 1: an erased result is never answered locally", got)
	}
	if rec := getRecord(t, "2captcha", kept); rec.Code != "" || !rec.PayloadErased {
		t.Errorf("record after the provider's answer: code %q, erased %v; want it left erased", rec.Code, rec.PayloadErased)
	}

	// Nothing to replay or release: 409 with the reason.
	for _, path := range []string{"/replay?force=true", "/replay", "/release"} {
		status, body := adminDo(t, http.MethodPost, "/pingback/records/2captcha/"+kept+path, "")
		if status != http.StatusConflict || !strings.Contains(string(body), "payload erased") {
			t.Errorf("POST %s of the erased result: %d %s; want 409 saying the payload was erased", path, status, body)
		}
	}
	if n := app.Count("2captcha:" + kept); n != 1 {
		t.Errorf("app got %s %d times, want once", kept, n)
	}
}

// TestKeepPayloadConfig: keep_payload must be more than 0 and at most
// retention, else a config error naming both.
func TestKeepPayloadConfig(t *testing.T) {
	for _, tc := range []struct {
		name, global string
		err          []string // none: valid
	}{
		{"unset", "", nil},
		{"set", "keep_payload 10m", nil},
		{"equal to retention", "retention 2h\n\tkeep_payload 2h", nil},
		{"zero", "keep_payload 0s", []string{"keep_payload must be more than 0 and at most retention (24h0m0s), got 0s"}},
		{"negative", "keep_payload -1m", []string{"keep_payload must be more than 0", "got -1m0s"}},
		{"above retention", "retention 1h\n\tkeep_payload 2h", []string{"keep_payload must be more than 0 and at most retention (1h0m0s), got 2h0m0s"}},
		{"above the default retention", "keep_payload 25h", []string{"at most retention (24h0m0s), got 25h0m0s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cf := "{\n\tpingback {\n\tstorage_dir " + t.TempDir() + "\n\t" + tc.global + "\n\t}\n}\n:8080 {\n\trespond 200\n}\n"
			cfgJSON, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
			if err != nil {
				t.Fatalf("the parser refused what only Validate should: %v", err)
			}
			var cfg caddy.Config
			if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
				t.Fatal(err)
			}
			if tc.err == nil {
				if err := caddy.Validate(&cfg); err != nil {
					t.Errorf("validate: %v; want none", err)
				}
				return
			}
			assertErrHas(t, caddy.Validate(&cfg), tc.err...)
		})
	}

	t.Run("JSON", func(t *testing.T) {
		var cfg caddy.Config
		raw := `{"apps": {"pingback": {"storage_dir": ` + fmt.Sprintf("%q", t.TempDir()) + `, "retention": "1h", "keep_payload": "90m"}}}`
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			t.Fatal(err)
		}
		assertErrHas(t, caddy.Validate(&cfg), "keep_payload must be more than 0 and at most retention (1h0m0s), got 1h30m0s")
	})
}
