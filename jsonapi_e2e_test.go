package pingback

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/store"
)

// jsonSim is a simulator speaking one provider's JSON API on loopback.
type jsonSim struct {
	*captchasim.Sim
	url string
}

func newJSONSim(t *testing.T, cfg captchasim.Config) *jsonSim {
	t.Helper()
	sim, err := captchasim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = sim.Close() })
	return &jsonSim{Sim: sim, url: srv.URL}
}

// jsonCaddyfile is a config with one JSON-API provider: its block
// (api_endpoint the simulator), the poll block, a pingback route
// /cb/<provider> in front of app and pingback_track on /api/<provider>/*
// (adding callbackUrl) in front of the simulator.
func jsonCaddyfile(dir, logFile, provider, poll string, sim *jsonSim, app *appStub, providerLines string) string {
	return fmt.Sprintf(`{
	admin %[1]s
	http_port %[2]s
	https_port 9443
	grace_period 1ns
	auto_https off
	skip_install_trust
	persist_config off
	log {
		output file %[3]s
		format json
		level INFO
	}
	pingback {
		storage_dir %[4]s
		provider %[5]s {
			api_endpoint %[6]s
			api_key %[7]s
			%[11]s
		}
		%[8]s
	}
}
http://localhost:%[2]s {
	handle /cb/%[5]s {
		pingback {
			provider %[5]s
			# These tests send callbacks for ids no submission made.
			unknown_ids accept
		}
		reverse_proxy %[9]s
	}
	handle /api/%[5]s/* {
		pingback_track {
			provider %[5]s
			pingback_url %[10]s/cb/%[5]s
		}
		reverse_proxy %[12]s
	}
	respond 404
}
`, testAdmin, testHTTPPort, logFile, dir, provider, sim.url, captchasim.DefaultKey, poll, app.hostPort(), testBase, providerLines,
		strings.TrimPrefix(sim.url, "http://"))
}

func startJSONCaddy(t *testing.T, provider, poll string, sim *jsonSim, app *appStub, providerLines string) string {
	t.Helper()
	dir := t.TempDir()
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	loadCaddyfile(t, jsonCaddyfile(dir, logFile, provider, poll, sim, app, providerLines))
	t.Cleanup(func() {
		unloadCaddy(t)
		if t.Failed() {
			logTail(t, logFile, 60)
		}
	})
	return logFile
}

// jsonCall POSTs a JSON body to the app's view of the provider's API
// (Caddy's /api/<provider>/<method>) and returns the answer.
func jsonCall(t *testing.T, provider, method, body string) trkResponse {
	t.Helper()
	return trkDo(t, http.MethodPost, "/api/"+provider+"/"+method, "application/json", strings.NewReader(body))
}

// createTask submits a reCAPTCHA task as the official clients do (no
// callbackUrl) and returns its id as a string.
func createTask(t *testing.T, provider string) string {
	t.Helper()
	resp := jsonCall(t, provider, "createTask",
		`{"clientKey":"`+captchasim.DefaultKey+`","task":{"type":"RecaptchaV2TaskProxyless","websiteURL":"https://a.example/","websiteKey":"6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-"}}`)
	var a struct {
		ErrorID int             `json:"errorId"`
		TaskID  json.RawMessage `json:"taskId"`
	}
	if resp.status != http.StatusOK || json.Unmarshal(resp.body, &a) != nil || a.ErrorID != 0 {
		t.Fatalf("createTask answered %d %q", resp.status, resp.body)
	}
	id := strings.Trim(string(a.TaskID), `"`)
	return id
}

// deliveriesOf returns what the app received for key.
func deliveriesOf(app *appStub, key string) []seenRequest {
	var out []seenRequest
	for _, r := range app.requests() {
		if r.Header.Get(HeaderIdempotencyKey) == key {
			out = append(out, r)
		}
	}
	return out
}

// TestJSONProvidersRecoverLostCallbacks: for each JSON-API provider, an
// app that submits with createTask through pingback_track (without a
// callbackUrl, like the official clients) gets the plugin's callbackUrl
// added; with every callback dropped, the plugin polls getTaskResult and
// delivers the result once to the callback route in the provider's own
// callback format (anti-captcha and CapMonster: JSON with a numeric taskId;
// CapSolver: a string taskId; 2captcha API v2: the form id/code), marked
// X-Pingback-Source: poll; the app's later getTaskResult is answered
// locally, exactly as the provider answered.
func TestJSONProvidersRecoverLostCallbacks(t *testing.T) {
	for _, tc := range []struct {
		provider, flavor string
		form, stringID   bool
	}{
		{"anticaptcha", captchasim.FlavorAntiCaptcha, false, false},
		{"capmonster", captchasim.FlavorAntiCaptcha, false, false},
		{"capsolver", captchasim.FlavorCapSolver, false, true},
		{"2captcha", captchasim.Flavor2Captcha, true, false},
		{"rucaptcha", captchasim.Flavor2Captcha, true, false},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			sim := newJSONSim(t, captchasim.Config{JSONFlavor: tc.flavor, DropRate: 1, SolveMin: 200 * time.Millisecond, SolveMax: 500 * time.Millisecond, Seed: 7})
			startJSONCaddy(t, tc.provider, pollBlock("after 1s", "interval 5s"), sim, app, "")
			id := createTask(t, tc.provider)
			info, ok := sim.Task(id)
			if pb, tok, _ := untokened(info.Pingback); !ok || pb != testBase+"/cb/"+tc.provider || tok == "" {
				t.Fatalf("simulator's task %+v: want the callbackUrl the plugin added", info)
			}
			task, err := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: tc.provider, ID: id})
			if err != nil || task.API != "json" || task.Method != "RecaptchaV2TaskProxyless" {
				t.Fatalf("tracked task %+v, %v", task, err)
			}
			key := tc.provider + ":" + id
			waitFor(t, 15*time.Second, "the polled delivery", func() bool {
				rec, err := runningApp(t).store(time.Second).Get(t.Context(), store.Key{Provider: tc.provider, ID: id})
				return err == nil && rec.State == store.StateDelivered
			})
			got := deliveriesOf(app, key)
			if len(got) != 1 {
				t.Fatalf("app got %d deliveries, want 1", len(got))
			}
			d := got[0]
			if d.Method != http.MethodPost || d.URI != "/cb/"+tc.provider || d.Header.Get(HeaderSource) != "poll" {
				t.Errorf("delivered as %s %s (source %s)", d.Method, d.URI, d.Header.Get(HeaderSource))
			}
			if tc.form {
				form, _ := url.ParseQuery(d.Body)
				if d.Header.Get("Content-Type") != "application/x-www-form-urlencoded" || form.Get("id") != id || form.Get("code") != info.Code {
					t.Errorf("form delivery %s %q, want id %s code %.20s", d.Header.Get("Content-Type"), d.Body, id, info.Code)
				}
			} else {
				var cb map[string]json.RawMessage
				if d.Header.Get("Content-Type") != "application/json" || json.Unmarshal([]byte(d.Body), &cb) != nil {
					t.Fatalf("JSON delivery %s %q", d.Header.Get("Content-Type"), d.Body)
				}
				wantID := id
				if tc.stringID {
					wantID = `"` + id + `"`
				}
				var sol struct{ GRecaptchaResponse string }
				_ = json.Unmarshal(cb["solution"], &sol)
				if string(cb["taskId"]) != wantID || string(cb["status"]) != `"ready"` || sol.GRecaptchaResponse != info.Code {
					t.Errorf("JSON delivery %s, want taskId %s and the token", d.Body, wantID)
				}
			}
			// The app polls by itself now: answered locally.
			calls := sim.Stats().GetTaskResultCalls
			idJSON := id
			if tc.stringID {
				idJSON = `"` + id + `"`
			}
			local := jsonCall(t, tc.provider, "getTaskResult", `{"clientKey":"`+captchasim.DefaultKey+`","taskId":`+idJSON+`}`)
			rec := getRecord(t, tc.provider, id)
			if local.status != http.StatusOK || string(local.body) != string(rec.Answer) || local.header.Get("Content-Type") != "application/json" {
				t.Errorf("local getTaskResult %d %s %q, want the kept answer %q", local.status, local.header.Get("Content-Type"), local.body, rec.Answer)
			}
			if n := sim.Stats().GetTaskResultCalls; n != calls {
				t.Errorf("the local answer reached the provider (%d calls, was %d)", n, calls)
			}
			// A wrong key passes through: the provider judges it.
			wrong := jsonCall(t, tc.provider, "getTaskResult", `{"clientKey":"wrong","taskId":`+idJSON+`}`)
			if !strings.Contains(string(wrong.body), "ERROR_KEY_DOES_NOT_EXIST") {
				t.Errorf("wrong key answered %q", wrong.body)
			}
		})
	}
}

// TestJSONCallbacksReachTheApp: callbacks that do come (anti-captcha's JSON
// with a numeric taskId, CapSolver's with a string one, 2captcha v2's form)
// are stored and forwarded byte-identical, and the task is done (no poll).
func TestJSONCallbacksReachTheApp(t *testing.T) {
	for _, tc := range []struct{ provider, flavor string }{
		{"anticaptcha", captchasim.FlavorAntiCaptcha},
		{"capsolver", captchasim.FlavorCapSolver},
		{"2captcha", captchasim.Flavor2Captcha},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			sim := newJSONSim(t, captchasim.Config{JSONFlavor: tc.flavor, SolveMin: 100 * time.Millisecond, SolveMax: 200 * time.Millisecond})
			startJSONCaddy(t, tc.provider, pollBlock("after 30s"), sim, app, "")
			id := createTask(t, tc.provider)
			key := tc.provider + ":" + id
			waitFor(t, 10*time.Second, "the callback", func() bool { return len(deliveriesOf(app, key)) == 1 })
			d := deliveriesOf(app, key)[0]
			if d.Header.Get(HeaderSource) != "callback" {
				t.Errorf("source %q", d.Header.Get(HeaderSource))
			}
			rec := getRecord(t, tc.provider, id)
			if string(rec.Request.Body) != d.Body {
				t.Errorf("app got %q, the provider sent %q", d.Body, rec.Request.Body)
			}
			task, err := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: tc.provider, ID: id})
			if err != nil || task.State != store.TaskDone {
				t.Errorf("task %+v, %v; want done", task, err)
			}
			if tc.flavor == captchasim.Flavor2Captcha {
				return // a form callback has no getTaskResult shape: passed through
			}
			// Local getTaskResult for a result that came by callback.
			calls := sim.Stats().GetTaskResultCalls
			idJSON, _ := json.Marshal(id)
			if tc.flavor != captchasim.FlavorCapSolver {
				idJSON = []byte(id)
			}
			local := jsonCall(t, tc.provider, "getTaskResult", `{"clientKey":"`+captchasim.DefaultKey+`","taskId":`+string(idJSON)+`}`)
			if string(local.body) != string(rec.Answer) || sim.Stats().GetTaskResultCalls != calls {
				t.Errorf("local getTaskResult %q, want the callback's body %q without asking the provider", local.body, rec.Answer)
			}
		})
	}
}

// TestJSONAppPollsItself: the app polling getTaskResult through
// pingback_track gets the result first: it is stored as delivered and never
// sent to the callback route; the app's calls count toward CapMonster's
// 120-per-task limit, which the plugin's own polls never pass; an unknown
// task (forgotten by the provider) expires at the first poll.
func TestJSONAppPollsItself(t *testing.T) {
	t.Run("result seen in the app's own poll", func(t *testing.T) {
		app := newAppStub(t)
		sim := newJSONSim(t, captchasim.Config{DropRate: 1, SolveMin: time.Hour, SolveMax: time.Hour})
		startJSONCaddy(t, "capmonster", pollBlock("after 30s"), sim, app, "")
		id := createTask(t, "capmonster")
		sim.Solve(id)
		ask := `{"clientKey":"` + captchasim.DefaultKey + `","taskId":` + id + `}`
		first := jsonCall(t, "capmonster", "getTaskResult", ask)
		if !strings.Contains(string(first.body), `"status":"ready"`) {
			t.Fatalf("passed-through answer %q", first.body)
		}
		rec := getRecord(t, "capmonster", id)
		if rec.State != store.StateDelivered || string(rec.Answer) != string(first.body) {
			t.Errorf("record %+v; want delivered with the provider's answer", rec.Delivery)
		}
		if n := len(deliveriesOf(app, "capmonster:"+id)); n != 0 {
			t.Errorf("app got %d callback deliveries of a result it fetched itself", n)
		}
		if again := jsonCall(t, "capmonster", "getTaskResult", ask); string(again.body) != string(first.body) {
			t.Errorf("local answer %q, want %q", again.body, first.body)
		}
	})

	t.Run("CapMonster's per-task limit", func(t *testing.T) {
		app := newAppStub(t)
		sim := newJSONSim(t, captchasim.Config{DropRate: 1, SolveMin: time.Hour, SolveMax: time.Hour, MaxResultCalls: 120})
		startJSONCaddy(t, "capmonster", pollBlock("after 1s", "interval 5s"), sim, app, "")
		id := createTask(t, "capmonster")
		ask := `{"clientKey":"` + captchasim.DefaultKey + `","taskId":` + id + `}`
		for range 118 {
			if r := jsonCall(t, "capmonster", "getTaskResult", ask); !strings.Contains(string(r.body), "processing") {
				t.Fatalf("app's poll answered %q", r.body)
			}
		}
		waitFor(t, 30*time.Second, "the task to expire at the limit", func() bool {
			task, err := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: "capmonster", ID: id})
			return err == nil && task.State == store.TaskExpired
		})
		task, _ := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: "capmonster", ID: id})
		info, _ := sim.Task(id)
		if !strings.Contains(task.LastError, "limit") || task.AppPolls != 118 || info.ResCalls != 120 {
			t.Errorf("task %+v; simulator saw %d calls; want 118 from the app, 2 from the plugin, 120 in all", task, info.ResCalls)
		}
		if n := sim.Stats().ResultLimitExceeded; n != 0 {
			t.Errorf("%d calls beyond CapMonster's limit", n)
		}
	})

	t.Run("unknown task expires", func(t *testing.T) {
		app := newAppStub(t)
		sim := newJSONSim(t, captchasim.Config{DropRate: 1, SolveMin: time.Hour, SolveMax: time.Hour, ForgetAfter: 500 * time.Millisecond})
		startJSONCaddy(t, "anticaptcha", pollBlock("after 1s"), sim, app, "")
		id := createTask(t, "anticaptcha")
		waitFor(t, 10*time.Second, "the task to expire", func() bool {
			task, err := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: "anticaptcha", ID: id})
			return err == nil && task.State == store.TaskExpired
		})
		task, _ := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: "anticaptcha", ID: id})
		if !strings.Contains(task.LastError, "ERROR_NO_SUCH_CAPCHA_ID") || task.Polls != 1 {
			t.Errorf("task %+v; want expired after one poll answered ERROR_NO_SUCH_CAPCHA_ID", task)
		}
	})
}

// TestCreateTaskForwardedByteIdentical: pingback_track forwards createTask
// requests byte for byte, except for the callbackUrl it adds as the last
// member when the request has none (a null or empty one counts as none and
// is taken out); a request with its own callbackUrl, or one that is not
// JSON, reaches the provider unchanged; the provider's answer reaches the
// app unchanged, and the task is tracked with the URL that was sent.
func TestCreateTaskForwardedByteIdentical(t *testing.T) {
	app := newAppStub(t)
	prov := newTrkProvider(t)
	startJSONCaddy(t, "anticaptcha", pollBlock("after 30s"), &jsonSim{url: prov.URL}, app, "")
	ours := testBase + "/cb/anticaptcha"
	own := testBase + "/cb/anticaptcha?own=1"
	added := `,"callbackUrl":"` + ours + `"`
	tests := []struct {
		name, body, sent, tracked string
	}{
		{"no callbackUrl",
			"{\"clientKey\":\"K\", \"task\" : {\"type\":\"RecaptchaV2TaskProxyless\",\"websiteURL\":\"https://a.example/?x=1&y=<2>\",\"callbackUrl\":null},\"softId\":0}\n",
			"{\"clientKey\":\"K\", \"task\" : {\"type\":\"RecaptchaV2TaskProxyless\",\"websiteURL\":\"https://a.example/?x=1&y=<2>\",\"callbackUrl\":null},\"softId\":0" + added + "}\n",
			ours},
		{"null callbackUrl", `{"clientKey":"K","callbackUrl":null,"task":{"type":"T"}}`, `{"clientKey":"K","task":{"type":"T"}` + added + `}`, ours},
		{"empty callbackUrl", `{"callbackUrl":"", "clientKey":"K","task":{"type":"T"}}`, `{ "clientKey":"K","task":{"type":"T"}` + added + `}`, ours},
		{"own callbackUrl", `{"clientKey":"K","task":{"type":"T"},"callbackUrl":"` + own + `"}`, `{"clientKey":"K","task":{"type":"T"},"callbackUrl":"` + own + `"}`, own},
		{"not JSON", `clientKey=K&task=T`, `clientKey=K&task=T`, ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprint(7654321 + i)
			answer := `{"errorId":0,"taskId":` + id + `}`
			prov.answer("createTask", trkAnswer{status: http.StatusOK, header: map[string]string{"Content-Type": "application/json"}, body: []byte(answer)})
			prov.reset()
			resp := jsonCall(t, "anticaptcha", "createTask", tc.body)
			if string(resp.body) != answer {
				t.Errorf("app got %q, the provider answered %q", resp.body, answer)
			}
			seen := prov.requests("createTask")
			if len(seen) != 1 {
				t.Fatalf("provider got %q", seen)
			}
			sent, tok, _ := untokened(string(seen[0].Body))
			if sent != tc.sent || (tok == "") != (tc.tracked == "") {
				t.Fatalf("provider got %q (token %q)\nwant        %q with a token", seen, tok, tc.sent)
			}
			if cl := seen[0].Header.Get("Content-Length"); cl != "" && cl != fmt.Sprint(len(seen[0].Body)) {
				t.Errorf("Content-Length %s for %d bytes", cl, len(seen[0].Body))
			}
			task, err := runningApp(t).store(time.Second).GetTask(t.Context(), store.Key{Provider: "anticaptcha", ID: id})
			if tc.tracked == "" {
				if err == nil {
					t.Errorf("tracked %+v, want untracked", task)
				}
				return
			}
			if err != nil || task.PingbackURL != tc.tracked || task.API != "json" {
				t.Errorf("task %+v, %v; want tracked with %s", task, err, tc.tracked)
			}
		})
	}
}

// TestCapSolverSynchronousAnswer: a createTask answer that already holds
// the solution (CapSolver's image tasks) is stored at once: delivered to
// the callback URL like a polled result when one is known, and stored as
// delivered when none is (the app has it in the answer).
func TestCapSolverSynchronousAnswer(t *testing.T) {
	for _, withCallback := range []bool{true, false} {
		t.Run(fmt.Sprint("callback ", withCallback), func(t *testing.T) {
			app := newAppStub(t)
			sim := newJSONSim(t, captchasim.Config{JSONFlavor: captchasim.FlavorCapSolver})
			dir := t.TempDir()
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			cf := jsonCaddyfile(dir, logFile, "capsolver", pollBlock("after 30s"), sim, app, "")
			if !withCallback {
				cf = strings.Replace(cf, "\t\t\tpingback_url "+testBase+"/cb/capsolver\n", "", 1)
			}
			loadCaddyfile(t, cf)
			t.Cleanup(func() { unloadCaddy(t) })
			resp := jsonCall(t, "capsolver", "createTask", `{"clientKey":"`+captchasim.DefaultKey+`","task":{"type":"ImageToTextTask","body":"iVBORw0KGgo="}}`)
			var a struct {
				TaskID   string          `json:"taskId"`
				Status   string          `json:"status"`
				Solution json.RawMessage `json:"solution"`
			}
			if json.Unmarshal(resp.body, &a) != nil || a.Status != "ready" {
				t.Fatalf("createTask answered %q", resp.body)
			}
			rec := getRecord(t, "capsolver", a.TaskID)
			if string(rec.Answer) != string(resp.body) {
				t.Errorf("stored answer %q, want the createTask answer", rec.Answer)
			}
			key := "capsolver:" + a.TaskID
			if !withCallback {
				if rec.State != store.StateDelivered || len(deliveriesOf(app, key)) != 0 {
					t.Errorf("record %s, %d deliveries; want stored as delivered, none sent", rec.State, len(deliveriesOf(app, key)))
				}
				return
			}
			waitFor(t, 10*time.Second, "the delivery", func() bool { return len(deliveriesOf(app, key)) == 1 })
			d := deliveriesOf(app, key)[0]
			var cb struct {
				TaskID   string          `json:"taskId"`
				Solution json.RawMessage `json:"solution"`
			}
			if json.Unmarshal([]byte(d.Body), &cb) != nil || cb.TaskID != a.TaskID || string(cb.Solution) != string(a.Solution) || d.Header.Get(HeaderSource) != "poll" {
				t.Errorf("delivery %s %q", d.Header.Get(HeaderSource), d.Body)
			}
		})
	}
}

// TestAckTimeoutDefaults: with an app that does not answer, the provider's
// callback is answered 200 at the provider's default ack_timeout: 1s for
// the anti-captcha family, which closes the connection at 2 s, 2s for the
// others.
func TestAckTimeoutDefaults(t *testing.T) {
	for _, tc := range []struct {
		provider, body, ctype string
		want                  time.Duration
	}{
		{"anticaptcha", `{"taskId":7100,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`, "application/json", time.Second},
		{"capmonster", `{"taskId":7101,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`, "application/json", time.Second},
		{"capsolver", `{"taskId":"ab-7102","errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`, "application/json", 2 * time.Second},
		{"2captcha", `id=7103&code=T`, "application/x-www-form-urlencoded", 2 * time.Second},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			release := make(chan struct{})
			app.tune(func() { app.release = release })
			defer close(release)
			startJSONCaddy(t, tc.provider, "", &jsonSim{url: "http://127.0.0.1:1"}, app, "")
			start := time.Now()
			resp := trkDo(t, http.MethodPost, "/cb/"+tc.provider, tc.ctype, strings.NewReader(tc.body))
			took := time.Since(start)
			if resp.status != http.StatusOK || string(resp.body) != "OK" {
				t.Fatalf("answered %d %q", resp.status, resp.body)
			}
			if took < tc.want || took > tc.want+900*time.Millisecond {
				t.Errorf("answered after %s, want at the default ack_timeout %s", took, tc.want)
			}
		})
	}
}
