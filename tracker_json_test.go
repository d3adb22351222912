package pingback

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
	"github.com/caddy-pingback/pingback/internal/testkit"
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
func jsonCaddyfile(dir, logFile, provider, poll string, sim *jsonSim, app *testkit.App, providerLines string) string {
	g := testGlobals(fmt.Sprintf("storage_dir %s\nprovider %s {\n\tapi_endpoint %s\n\tapi_key %s\n\t%s\n}\n%s",
		dir, provider, sim.url, captchasim.DefaultKey, providerLines, poll))
	g.LogFile = logFile
	return g.Caddyfile(fmt.Sprintf(`http://localhost:%[1]s {
	handle /cb/%[2]s {
		pingback {
			provider %[2]s
			# These tests send callbacks for ids no submission made.
			unknown_ids accept
		}
		reverse_proxy %[3]s
	}
	handle /api/%[2]s/* {
		pingback_track {
			provider %[2]s
			pingback_url %[4]s/cb/%[2]s
		}
		reverse_proxy %[5]s
	}
	respond 404
}
`, testHTTPPort, provider, app.HostPort(), testBase, strings.TrimPrefix(sim.url, "http://")))
}

func startJSONCaddy(t *testing.T, provider, poll string, sim *jsonSim, app *testkit.App, providerLines string) string {
	t.Helper()
	dir := t.TempDir()
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	loadCaddyfile(t, jsonCaddyfile(dir, logFile, provider, poll, sim, app, providerLines))
	t.Cleanup(func() {
		unloadCaddy(t)
		if t.Failed() {
			testkit.LogTail(t, logFile, 60)
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
	return createTaskWith(t, provider, captchasim.DefaultKey)
}

// deliveriesOf returns what the app received for key.
func deliveriesOf(app *testkit.App, key string) []testkit.Received {
	var out []testkit.Received
	for _, r := range app.Requests() {
		if r.Header.Get(HeaderIdempotencyKey) == key {
			out = append(out, r)
		}
	}
	return out
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
		testkit.WaitFor(t, 30*time.Second, "the task to expire at the limit", func() bool {
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
		testkit.WaitFor(t, 10*time.Second, "the task to expire", func() bool {
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
			testkit.WaitFor(t, 10*time.Second, "the delivery", func() bool { return len(deliveriesOf(app, key)) == 1 })
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

// npmClientsDir holds the official clients' test scripts; .ci/run
// installs their pinned packages there (npm ci) and sets
// PINGBACK_NPM_CLIENTS=1, which makes a missing install a failure.
const npmClientsDir = "testdata/npmclients"

// npmHTTPSPort is the HTTPS port of the test's Caddy, which serves the
// clients' API host names with certificates from its local CA; a free
// port picked once per test process, like the harness's.
var npmHTTPSPort = processPort()

// TestOfficialNPMClients runs the official, unchanged JSON-API clients
// (npm @antiadmin/anticaptchaofficial and @zennolab_com/capmonstercloud-client)
// against pingback_track: their hard-coded API hosts (api.anti-captcha.com,
// api.capmonster.cloud) are served by this Caddy over TLS from its internal
// CA, which Node trusts through NODE_EXTRA_CA_CERTS; a preloaded module
// (testdata/npmclients/hostmap.js) sends the clients' TLS connections for
// those names to Caddy's port, as an /etc/hosts entry would. The simulator
// solves a reCAPTCHA task and drops every callback: the client still gets
// the right token, and the app's callback route receives it once, polled
// by the plugin.
func TestOfficialNPMClients(t *testing.T) {
	node, err := exec.LookPath("node")
	_, statErr := os.Stat(filepath.Join(npmClientsDir, "node_modules", "@zennolab_com", "capmonstercloud-client"))
	if err != nil || statErr != nil {
		if os.Getenv("PINGBACK_NPM_CLIENTS") != "" {
			t.Fatalf("PINGBACK_NPM_CLIENTS is set but node (%v) or the clients in %s (%v) are missing", err, npmClientsDir, statErr)
		}
		t.Skipf("node or the npm clients are not installed (run: cd %s && npm ci)", npmClientsDir)
	}
	for _, tc := range []struct{ provider, host, script string }{
		{"anticaptcha", "api.anti-captcha.com", "anticaptcha.js"},
		{"capmonster", "api.capmonster.cloud", "capmonster.js"},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			app := newAppStub(t)
			sim := newJSONSim(t, captchasim.Config{DropRate: 1, SolveMin: 200 * time.Millisecond, SolveMax: 400 * time.Millisecond})
			caddyData := t.TempDir()
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			g := testGlobals(fmt.Sprintf("storage_dir %s\nprovider %s {\n\tapi_endpoint %s\n\tapi_key %s\n}\npoll {\n\tafter 1s\n\tinterval 5s\n}",
				t.TempDir(), tc.provider, sim.url, captchasim.DefaultKey))
			g.HTTPSPort, g.AutoHTTPS, g.Options, g.LogFile = npmHTTPSPort, "disable_redirects", "local_certs\n\tstorage file_system "+caddyData, logFile
			loadCaddyfile(t, g.Caddyfile(fmt.Sprintf(`%[4]s:%[3]s {
	tls internal
	pingback_track {
		provider %[1]s
		pingback_url http://localhost:%[2]s/cb
	}
	reverse_proxy %[5]s
}
http://localhost:%[2]s {
	handle /cb {
		pingback {
			provider %[1]s
		}
		reverse_proxy %[6]s
	}
	respond 404
}
`, tc.provider, testHTTPPort, npmHTTPSPort, tc.host, strings.TrimPrefix(sim.url, "http://"), app.HostPort())))
			t.Cleanup(func() {
				unloadCaddy(t)
				if t.Failed() {
					testkit.LogTail(t, logFile, 60)
				}
			})
			rootCA := filepath.Join(caddyData, "pki", "authorities", "local", "root.crt")
			waitTLS(t, rootCA, tc.host)

			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "--require", "./hostmap.js", tc.script)
			cmd.Dir = npmClientsDir
			cmd.Env = append(os.Environ(),
				"NODE_EXTRA_CA_CERTS="+rootCA,
				"PINGBACK_API_HOSTS="+tc.host,
				"PINGBACK_TLS_PORT="+npmHTTPSPort,
				"PINGBACK_API_KEY="+captchasim.DefaultKey,
			)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v\n%s", tc.script, err, stderr.String())
			}
			var got struct{ Token string }
			if err := json.Unmarshal(out, &got); err != nil || got.Token == "" {
				t.Fatalf("%s printed %q: %v", tc.script, out, err)
			}
			var keys []string
			for _, r := range app.Requests() {
				keys = append(keys, r.Header.Get(HeaderIdempotencyKey))
			}
			if len(keys) != 1 || !strings.HasPrefix(keys[0], tc.provider+":") {
				t.Fatalf("app received %v, want one delivery", keys)
			}
			id := strings.TrimPrefix(keys[0], tc.provider+":")
			info, ok := sim.Task(id)
			if !ok || info.Code != got.Token {
				t.Errorf("client got token %.20q, the simulator solved %s with %.20q", got.Token, id, info.Code)
			}
			// The plugin's callbackUrl, with the task's pingback token added.
			_, query, _ := strings.Cut(info.Pingback, "?")
			token, n := protocol.QueryToken(query)
			if !info.PingbackDrop || protocol.StripTokenURI(info.Pingback) != testBase+"/cb" || n != 1 || !protocol.ValidToken(token) {
				t.Errorf("simulator task %+v: want the plugin's callbackUrl with one pingback token, dropped", info)
			}
			if r := app.Requests()[0]; r.Header.Get(HeaderSource) != "poll" {
				t.Errorf("delivery source %q, want poll", r.Header.Get(HeaderSource))
			}
			if n := sim.Stats().CreateTaskCalls; n != 1 {
				t.Errorf("simulator got %d createTask calls, want 1", n)
			}
		})
	}
}

// waitTLS waits until Caddy serves host with a certificate of its local CA.
func waitTLS(t *testing.T, rootCA, host string) {
	t.Helper()
	testkit.WaitFor(t, 30*time.Second, "Caddy's certificate for "+host, func() bool {
		pem, err := os.ReadFile(rootCA)
		if err != nil {
			return false
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		conn, err := tls.Dial("tcp", "127.0.0.1:"+npmHTTPSPort, &tls.Config{ServerName: host, RootCAs: pool})
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	})
}
