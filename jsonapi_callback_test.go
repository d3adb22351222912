package pingback

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestJSONCallbackIDKeysAndErrors: a JSON callback whose taskId is null
// but whose id is valid is a result (200, stored, forwarded), not a 400;
// an errorId callback whose error is not the task's outcome (an account
// error such as ERROR_KEY_DOES_NOT_EXIST) is answered 200 and neither
// stored nor forwarded, so the tracked task stays pending and the poller
// delivers its real result, once; a task-final error is a result.
func TestJSONCallbackIDKeysAndErrors(t *testing.T) {
	const provider = "anticaptcha"
	app := newAppStub(t)
	sim := newJSONSim(t, captchasim.Config{JSONFlavor: captchasim.FlavorAntiCaptcha, DropRate: 1,
		SolveMin: 100 * time.Millisecond, SolveMax: 200 * time.Millisecond, Seed: 3})
	startJSONCaddy(t, provider, pollBlock("after 1s", "interval 5s"), sim, app, "")
	post := func(body string) trkResponse {
		return trkDo(t, http.MethodPost, "/cb/"+provider, "application/json", strings.NewReader(body))
	}

	// A null taskId beside a valid id.
	if r := post(`{"taskId":null,"id":4242,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T1"}}`); r.status != http.StatusOK {
		t.Fatalf("null taskId with a valid id answered %d %q, want 200", r.status, r.body)
	}
	if rec := getRecord(t, provider, "4242"); rec.Code != `{"gRecaptchaResponse":"T1"}` {
		t.Errorf("stored code %q", rec.Code)
	}
	waitFor(t, 10*time.Second, "the forward", func() bool { return len(deliveriesOf(app, provider+":4242")) == 1 })

	// A task-final error is the task's result.
	if r := post(`{"taskId":4343,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`); r.status != http.StatusOK {
		t.Fatalf("task-final error callback answered %d %q", r.status, r.body)
	}
	if rec := getRecord(t, provider, "4343"); rec.Code != "ERROR_CAPTCHA_UNSOLVABLE" {
		t.Errorf("task-final error stored as %q", rec.Code)
	}

	// An account error for a tracked task: 200, nothing stored or
	// forwarded; the poller still gets the real result.
	id := createTask(t, provider)
	key := provider + ":" + id
	r := post(`{"taskId":` + id + `,"errorId":1,"errorCode":"ERROR_KEY_DOES_NOT_EXIST","errorDescription":"Account authorization key not found in the system"}`)
	if r.status != http.StatusOK {
		t.Fatalf("account error callback answered %d %q, want 200", r.status, r.body)
	}
	s := runningApp(t).store(time.Second)
	if rec, err := s.Get(t.Context(), store.Key{Provider: provider, ID: id}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("account error callback stored %+v, %v; want nothing", rec, err)
	}
	info, _ := sim.Task(id)
	waitFor(t, 15*time.Second, "the polled result", func() bool {
		rec, err := s.Get(t.Context(), store.Key{Provider: provider, ID: id})
		return err == nil && rec.State == store.StateDelivered
	})
	got := deliveriesOf(app, key)
	if len(got) != 1 || got[0].Header.Get(HeaderSource) != "poll" || !strings.Contains(got[0].Body, info.Code) {
		t.Fatalf("app got %d deliveries (%+v), want the polled result once", len(got), got)
	}
}
