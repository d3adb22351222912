package pingback

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// attemptWant is what one history entry must say.
type attemptWant struct {
	source  store.Source
	status  int
	outcome string
	err     string // "" for none
}

// checkHistory checks a record's history against want, entry by entry:
// numbered 1, 2, ... with their source, the app's status, outcome and
// error, each started no earlier than the one before and ended after it
// started.
func checkHistory(t *testing.T, got []store.Attempt, want []attemptWant) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("history has %d attempts, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Attempt != i+1 || g.Source != w.source || g.Status != w.status || g.Outcome != w.outcome || g.Error != w.err {
			t.Errorf("attempt %d = {%d %s status %d %s %q}, want {%d %s status %d %s %q}", i+1,
				g.Attempt, g.Source, g.Status, g.Outcome, g.Error, i+1, w.source, w.status, w.outcome, w.err)
		}
		if g.StartedAt.IsZero() || g.EndedAt.Before(g.StartedAt) || (i > 0 && g.StartedAt.Before(got[i-1].StartedAt)) {
			t.Errorf("attempt %d: started %v, ended %v (the one before started %v)", i+1, g.StartedAt, g.EndedAt, got[max(i-1, 0)].StartedAt)
		}
	}
}

// TestAttemptHistory follows the history of a record through the paths
// that forward it: the live callback, the replay loop's retry, a replay
// by hand (manual) and a bulk replay job (bulk), through
// GET /pingback/records/<provider>/<id>; the app sees replay for the last
// two.
func TestAttemptHistory(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "replay {\n\t\t\tbackoff 20ms 40ms\n\t\t\tmax_attempts 2\n\t\t}", pingbackSite("2captcha", "", app))
	record := func(id string) *store.Record {
		t.Helper()
		code, body := adminRequest(t, http.MethodGet, "/pingback/records/2captcha/"+id)
		var rec store.Record
		if code != http.StatusOK || json.Unmarshal(body, &rec) != nil {
			t.Fatalf("GET record %s: %d %s", id, code, body)
		}
		return &rec
	}
	const replayed = `caddy_pingback_forwards_total{outcome="delivered",provider="2captcha",source="replay"}`
	replayed0, _ := scrapeMetric(t, replayed) // the counter is the process's
	failed := attemptWant{store.SourceReplay, http.StatusServiceUnavailable, "failed", "app answered 503"}

	// 601: the live forward fails, the replay loop's retry delivers.
	app.setStatus(http.StatusServiceUnavailable)
	if code, _ := postForm(t, testBase+"/cb", "id=601&code=A"); code != http.StatusOK {
		t.Fatal("pingback refused")
	}
	waitForState(t, "2captcha", "601", store.StateFailed)
	app.setStatus(http.StatusOK)
	waitForState(t, "2captcha", "601", store.StateDelivered)
	// 602 and 603: parked after two failures.
	app.setStatus(http.StatusServiceUnavailable)
	for _, id := range []string{"602", "603"} {
		if code, _ := postForm(t, testBase+"/cb", "id="+id+"&code=B"); code != http.StatusOK {
			t.Fatal("pingback refused")
		}
		waitForState(t, "2captcha", id, store.StateParked)
	}
	app.setStatus(http.StatusOK)
	// 602 replayed by hand; then 603 by a bulk job (602 is delivered by
	// then, so the job matches 603 alone).
	if code, body := adminRequest(t, http.MethodPost, "/pingback/records/2captcha/602/replay"); code != http.StatusOK {
		t.Fatalf("replay 602: %d %s", code, body)
	}
	if code, _, body := adminJSON(t, http.MethodPost, "/pingback/replays", `{"state": "parked"}`); code != http.StatusAccepted {
		t.Fatalf("bulk replay: %d %s", code, body)
	}
	waitForState(t, "2captcha", "603", store.StateDelivered)

	live := func(status int, outcome, err string) attemptWant {
		return attemptWant{store.SourceCallback, status, outcome, err}
	}
	for _, tc := range []struct {
		id   string
		want []attemptWant
	}{
		{"601", []attemptWant{live(503, "failed", "app answered 503"), {store.SourceReplay, 200, "delivered", ""}}},
		{"602", []attemptWant{live(503, "failed", "app answered 503"), failed, {store.SourceManual, 200, "delivered", ""}}},
		{"603", []attemptWant{live(503, "failed", "app answered 503"), failed, {store.SourceBulk, 200, "delivered", ""}}},
	} {
		t.Run(tc.id, func(t *testing.T) {
			rec := record(tc.id)
			if rec.Attempts != len(tc.want) {
				t.Errorf("attempts %d, want %d", rec.Attempts, len(tc.want))
			}
			checkHistory(t, rec.History, tc.want)
			// Each forward's header said what the metric label says:
			// callback for the live one, replay for every other.
			n := 0
			for _, r := range app.requests() {
				if r.Header.Get(HeaderIdempotencyKey) != "2captcha:"+tc.id {
					continue
				}
				n++
				want := "replay"
				if n == 1 {
					want = "callback"
				}
				if src := r.Header.Get(HeaderSource); src != want {
					t.Errorf("forward %d arrived with %s %q, want %q", n, HeaderSource, src, want)
				}
			}
			if n != len(tc.want) {
				t.Errorf("the app saw %d forwards, want %d", n, len(tc.want))
			}
		})
	}
	waitFor(t, 5*time.Second, "forwards_total with source replay for the retry and the manual and bulk replays", func() bool {
		v, _ := scrapeMetric(t, replayed)
		return v == replayed0+3
	})
}
