package pingback

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// TestAdminGetRecordAndTask checks GET of one record and of one task
// (with result_at once its result arrived), good and bad input.
func TestAdminGetRecordAndTask(t *testing.T) {
	startAdminCaddy(t)
	status, answer := adminCall(t, http.MethodPost, adminRegistration(t, map[string]string{
		"provider": "2captcha", "id": "73000000001", "pingback_url": trkCallbackURL,
	}))
	if status != http.StatusCreated {
		t.Fatalf("register: %d %s", status, answer)
	}
	var task store.Task
	status, body := adminRequest(t, http.MethodGet, "/pingback/tasks/2captcha/73000000001")
	if status != http.StatusOK || json.Unmarshal(body, &task) != nil || task.State != store.TaskPending || !task.ResultAt.IsZero() {
		t.Fatalf("task before its result: %d %s, want 200, pending, no result_at", status, body)
	}
	if strings.Contains(string(body), "result_at") {
		t.Errorf("task JSON before its result carries result_at: %s", body)
	}
	if status, answer := adminCall(t, http.MethodPost, adminRegistration(t, map[string]string{
		"provider": "2captcha", "id": "73000000002", "pingback_url": trkCallbackURL,
	})); status != http.StatusCreated {
		t.Fatalf("register: %d %s", status, answer)
	}
	before := time.Now()
	if status, body := postForm(t, testBase+"/cb", "id=73000000001&code=TOKEN"); status != http.StatusOK {
		t.Fatalf("pingback: %d %s", status, body)
	}
	status, body = adminRequest(t, http.MethodGet, "/pingback/tasks/2captcha/73000000001")
	if status != http.StatusOK || json.Unmarshal(body, &task) != nil || task.State != store.TaskDone {
		t.Fatalf("task after its result: %d %s, want 200 and done", status, body)
	}
	rec := getRecord(t, "2captcha", "73000000001")
	if !task.ResultAt.Equal(rec.ReceivedAt) || task.ResultAt.Before(before.Add(-time.Second)) {
		t.Errorf("result_at %s, want the result's received_at %s", task.ResultAt, rec.ReceivedAt)
	}
	var got store.Record
	status, body = adminRequest(t, http.MethodGet, "/pingback/records/2captcha/73000000001")
	if status != http.StatusOK || json.Unmarshal(body, &got) != nil || got.Code != "TOKEN" || got.Key() != rec.Key() {
		t.Errorf("GET record: %d %s, want 200 and the record", status, body)
	}

	// The task list, by state.
	var list struct {
		Tasks []store.Task `json:"tasks"`
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{"73000000001", "73000000002"}},
		{"?state=done", []string{"73000000001"}},
		{"?state=pending&provider=2captcha", []string{"73000000002"}},
		{"?state=expired", nil},
		{"?limit=1", []string{"73000000001"}},
	} {
		status, body := adminRequest(t, http.MethodGet, "/pingback/tasks"+tc.query)
		if status != http.StatusOK || json.Unmarshal(body, &list) != nil {
			t.Fatalf("GET /pingback/tasks%s: %d %s", tc.query, status, body)
		}
		var ids []string
		for _, tk := range list.Tasks {
			ids = append(ids, tk.ID)
		}
		if !slices.Equal(ids, tc.want) {
			t.Errorf("GET /pingback/tasks%s = %v, want %v", tc.query, ids, tc.want)
		}
	}

	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/pingback/tasks?state=stopped", http.StatusBadRequest},
		{http.MethodGet, "/pingback/tasks?provider=deathbycaptcha", http.StatusBadRequest},
		{http.MethodGet, "/pingback/tasks?limit=100000", http.StatusBadRequest},
		{http.MethodGet, "/pingback/records/2captcha/404", http.StatusNotFound},
		{http.MethodGet, "/pingback/records/2captcha/", http.StatusNotFound},
		{http.MethodGet, "/pingback/records/2captcha/1/2/3", http.StatusNotFound},
		{http.MethodDelete, "/pingback/records/2captcha/73000000001/replay", http.StatusMethodNotAllowed},
		{http.MethodPost, "/pingback/records/2captcha/73000000001/replay?force=maybe", http.StatusBadRequest},
		{http.MethodGet, "/pingback/tasks/2captcha/404", http.StatusNotFound},
		{http.MethodGet, "/pingback/tasks/2captcha", http.StatusNotFound},
		{http.MethodGet, "/pingback/tasks//1", http.StatusNotFound},
		{http.MethodPost, "/pingback/tasks/2captcha/73000000001", http.StatusMethodNotAllowed},
	} {
		if status, body := adminRequest(t, tc.method, tc.path); status != tc.status || !strings.Contains(string(body), `"error"`) {
			t.Errorf("%s %s: %d %s, want %d with an error", tc.method, tc.path, status, body, tc.status)
		}
	}
}

// TestAdminReplayDeliveredNeedsForce checks that a replay by hand of a
// delivered result is refused with 409 (nothing forwarded, nothing
// changed) unless force=true.
func TestAdminReplayDeliveredNeedsForce(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	if status, body := postForm(t, testBase+"/cb", "id=95&code=T"); status != http.StatusOK {
		t.Fatalf("pingback: %d %s", status, body)
	}
	waitForState(t, "2captcha", "95", store.StateDelivered)
	before := getRecord(t, "2captcha", "95")
	for _, path := range []string{"/pingback/records/2captcha/95/replay", "/pingback/records/2captcha/95/replay?force=false"} {
		status, body := adminRequest(t, http.MethodPost, path)
		if status != http.StatusConflict || !strings.Contains(string(body), "force=true") {
			t.Errorf("POST %s: %d %s, want 409 naming force=true", path, status, body)
		}
	}
	if after := getRecord(t, "2captcha", "95"); after.Attempts != before.Attempts || after.State != store.StateDelivered || app.count("2captcha:95") != 1 {
		t.Errorf("refused replay changed the record (%+v) or forwarded (%d)", after.Delivery, app.count("2captcha:95"))
	}
	status, body := adminRequest(t, http.MethodPost, "/pingback/records/2captcha/95/replay?force=true")
	var rec store.Record
	if status != http.StatusOK || json.Unmarshal(body, &rec) != nil || rec.State != store.StateDelivered || rec.Attempts != before.Attempts+1 {
		t.Fatalf("forced replay: %d %s, want 200, delivered again at the next attempt", status, body)
	}
	if n := app.count("2captcha:95"); n != 2 {
		t.Errorf("app saw 2captcha:95 %d times, want 2", n)
	}
}

// scrapeMetric returns the value of the sample named by its line prefix
// (name{labels}) in the admin endpoint's /metrics, and whether it is there.
func scrapeMetric(t *testing.T, sample string) (float64, bool) {
	t.Helper()
	status, body := adminRequest(t, http.MethodGet, "/metrics")
	if status != http.StatusOK {
		t.Fatalf("/metrics: %d", status)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if ok && name == sample {
			v, err := strconv.ParseFloat(val, 64)
			if err != nil {
				t.Fatalf("%s: %v", sc.Text(), err)
			}
			return v, true
		}
	}
	return 0, false
}

// TestOperationsGauges checks the gauges and the histogram on Caddy's
// /metrics: last_callback_timestamp_seconds moves with a live pingback
// (not with a duplicate), both loops report their rounds while idle, and
// each forward is observed in forward_duration_seconds.
func TestOperationsGauges(t *testing.T) {
	app := newAppStub(t)
	startCaddy(t, "", pingbackSite("2captcha", "", app))
	const last = `caddy_pingback_last_callback_timestamp_seconds{provider="2captcha"}`
	const hist = `caddy_pingback_forward_duration_seconds_count{outcome="delivered",source="callback"}`
	n0, _ := scrapeMetric(t, hist)

	before := float64(time.Now().UnixNano()) / 1e9
	if status, body := postForm(t, testBase+"/cb", "id=96&code=T"); status != http.StatusOK {
		t.Fatalf("pingback: %d %s", status, body)
	}
	after := float64(time.Now().UnixNano()) / 1e9
	// The gauge is at most a second stale.
	var v float64
	waitFor(t, 3*time.Second, last+" at the pingback's time", func() bool {
		var ok bool
		v, ok = scrapeMetric(t, last)
		return ok && v >= before-1 && v <= after
	})
	if status, _ := postForm(t, testBase+"/cb", "id=96&code=T"); status != http.StatusOK {
		t.Fatal("duplicate refused")
	}
	if again, _ := scrapeMetric(t, last); again != v {
		t.Errorf("a duplicate moved %s from %v to %v", last, v, again)
	}
	waitFor(t, 5*time.Second, "the forward observed in the histogram", func() bool {
		n, _ := scrapeMetric(t, hist)
		return n == n0+1
	})
	for _, loop := range []string{"replay", "poll"} {
		name := `caddy_pingback_loop_last_run_timestamp_seconds{loop="` + loop + `"}`
		start := float64(time.Now().UnixNano()) / 1e9
		waitFor(t, 5*time.Second, name+" moving while idle", func() bool {
			v, _ := scrapeMetric(t, name)
			return v >= start
		})
	}
}
