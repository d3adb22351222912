package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// fakePauses holds each fakeBackend's pauses (the fake's fields are the
// other tests').
var fakePauses sync.Map // *fakeBackend → *pauseBook

type pauseBook struct {
	mu   sync.Mutex
	m    map[string]store.Pause
	puts int
}

func (b *fakeBackend) pauses() *pauseBook {
	v, _ := fakePauses.LoadOrStore(b, &pauseBook{m: map[string]store.Pause{}})
	return v.(*pauseBook)
}

func (b *fakeBackend) PutPause(_ context.Context, p store.Pause) (store.Pause, error) {
	pb := b.pauses()
	pb.mu.Lock()
	defer pb.mu.Unlock()
	pb.puts++
	if cur, ok := pb.m[p.Provider]; ok {
		cur.Reason, cur.Until = p.Reason, p.Until
		p = cur
	}
	pb.m[p.Provider] = p
	return p, nil
}

func (b *fakeBackend) DeletePause(_ context.Context, provider, _ string) (store.Pause, error) {
	pb := b.pauses()
	pb.mu.Lock()
	defer pb.mu.Unlock()
	p, ok := pb.m[provider]
	if !ok {
		return store.Pause{}, store.ErrNotFound
	}
	delete(pb.m, provider)
	return p, nil
}

func (b *fakeBackend) ListPauses(context.Context) ([]store.Pause, error) {
	pb := b.pauses()
	pb.mu.Lock()
	defer pb.mu.Unlock()
	var out []store.Pause
	for _, p := range pb.m {
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b store.Pause) int { return strings.Compare(a.Provider, b.Provider) })
	return out, nil
}

// TestPauseRoutes: the pause routes' bodies and answers; bad input is a
// 400 with a reason and changes nothing; a provider paused again keeps
// its since and takes the new reason and until; DELETE of a provider
// without a pause is a 404, and that of "*" removes only that one.
func TestPauseRoutes(t *testing.T) {
	b := &fakeBackend{ready: true, st: &fakeStore{}}
	api := newTestAPI(b, NewState())
	now := b.Now()
	for _, tc := range []struct{ name, body, want string }{
		{"no provider", `{"reason": "x"}`, "provider is required"},
		{"malformed until", `{"provider": "captchaai", "until": "tomorrow"}`, "until must be an RFC 3339 time"},
		{"until in the past", `{"provider": "captchaai", "until": "2026-12-01T11:59:59Z"}`, "is not in the future"},
		{"until now", `{"provider": "captchaai", "until": "2026-12-01T12:00:00Z"}`, "is not in the future"},
		{"unknown by", `{"provider": "captchaai", "by": "timer"}`, "by must be api, cli or console"},
		{"unknown field", `{"provider": "captchaai", "untill": "2026-12-01T13:00:00Z"}`, "unknown field"},
		{"not JSON", `provider=captchaai`, "body: want"},
		{"reason too long", `{"provider": "captchaai", "reason": "` + strings.Repeat("x", 1001) + `"}`, "at most 1000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := serve(t, api, http.MethodPost, "/pingback/pauses", tc.body)
			if code != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
				t.Errorf("POST %s: %d %q, want 400 saying %q", tc.body, code, msg, tc.want)
			}
		})
	}
	if n := b.pauses().puts; n != 0 {
		t.Fatalf("bad input reached the backend %d times", n)
	}

	var p adminapi.Pause
	code, body := serve(t, api, http.MethodPost, "/pingback/pauses", `{"provider": "captchaai", "reason": "deploy"}`)
	if code != http.StatusOK || json.Unmarshal([]byte(body), &p) != nil {
		t.Fatalf("POST: %d %s", code, body)
	}
	if p.Provider != "captchaai" || p.Reason != "deploy" || !p.Since.Equal(now) || p.Until != nil || p.By != "api" {
		t.Errorf("pause answered %+v", p)
	}
	if !strings.Contains(body, `"until":null`) {
		t.Errorf("a pause without end shows until null: %s", body)
	}
	code, body = serve(t, api, http.MethodPost, "/pingback/pauses", `{"provider": "captchaai", "reason": "longer", "until": "2026-12-01T13:00:00Z", "by": "cli"}`)
	if code != http.StatusOK || json.Unmarshal([]byte(body), &p) != nil || p.Reason != "longer" || p.Until == nil ||
		!p.Until.Equal(now.Add(time.Hour)) || p.By != "api" || !p.Since.Equal(now) {
		t.Errorf("POST again: %d %s; want the new reason and until, since and by kept", code, body)
	}
	if code, _ := serve(t, api, http.MethodPost, "/pingback/pauses", `{"provider": "*", "by": "console"}`); code != http.StatusOK {
		t.Fatalf("POST *: %d", code)
	}
	var list adminapi.PausesAnswer
	code, body = serve(t, api, http.MethodGet, "/pingback/pauses", "")
	if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil || len(list.Pauses) != 2 ||
		list.Pauses[0].Provider != "*" || list.Pauses[0].By != "console" || list.Pauses[1].Provider != "captchaai" {
		t.Errorf("GET: %d %s", code, body)
	}

	// A bulk replay is refused while every provider is paused.
	if code, msg := serve(t, api, http.MethodPost, "/pingback/replays", `{"provider": "2captcha", "state": "failed"}`); code != http.StatusConflict || !strings.Contains(msg, "paused") {
		t.Errorf("bulk replay while * is paused: %d %q, want 409 saying paused", code, msg)
	}

	if code, msg := serve(t, api, http.MethodDelete, "/pingback/pauses/2captcha", ""); code != http.StatusNotFound || !strings.Contains(msg, "not paused") {
		t.Errorf("DELETE of a provider without a pause: %d %q, want 404", code, msg)
	}
	var resumed adminapi.ResumedAnswer
	code, body = serve(t, api, http.MethodDelete, "/pingback/pauses/*", "")
	if code != http.StatusOK || json.Unmarshal([]byte(body), &resumed) != nil || resumed.Resumed.Provider != "*" {
		t.Errorf("DELETE *: %d %s", code, body)
	}
	if ps, _ := b.ListPauses(context.Background()); len(ps) != 1 || ps[0].Provider != "captchaai" {
		t.Errorf("after DELETE *, the pauses are %+v; want captchaai's alone", ps)
	}
	if code, msg := serve(t, api, http.MethodPost, "/pingback/replays", `{"provider": "captchaai", "state": "failed"}`); code != http.StatusConflict || !strings.Contains(msg, "provider captchaai is paused") {
		t.Errorf("bulk replay of a paused provider: %d %q, want 409", code, msg)
	}
	if code, _ := serve(t, api, http.MethodPost, "/pingback/replays", `{"provider": "2captcha", "state": "failed"}`); code != http.StatusAccepted {
		t.Errorf("bulk replay of a provider not paused: %d, want 202", code)
	}
	if code, _ := serve(t, api, http.MethodDelete, "/pingback/pauses/captchaai?by=bot", ""); code != http.StatusBadRequest {
		t.Errorf("DELETE with an unknown by: %d, want 400", code)
	}
	if code, _ := serve(t, api, http.MethodPut, "/pingback/pauses", "{}"); code != http.StatusMethodNotAllowed {
		t.Errorf("PUT: %d, want 405", code)
	}
}
