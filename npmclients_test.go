package pingback

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
	"github.com/caddy-pingback/pingback/internal/protocol"
)

// npmClientsDir holds the official clients' test scripts; .ci/run
// installs their pinned packages there (npm ci) and sets
// PINGBACK_NPM_CLIENTS=1, which makes a missing install a failure.
const npmClientsDir = "testdata/npmclients"

// npmHTTPSPort is the HTTPS port of the test's Caddy, which serves the
// clients' API host names with certificates from its local CA.
var npmHTTPSPort = envPort("PINGBACK_TEST_NPM_HTTPS_PORT", 9303)

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
			loadCaddyfile(t, fmt.Sprintf(`{
	admin %[1]s
	http_port %[2]s
	https_port %[3]s
	grace_period 1ns
	auto_https disable_redirects
	local_certs
	skip_install_trust
	persist_config off
	storage file_system %[4]s
	log {
		output file %[5]s
		format json
		level INFO
	}
	pingback {
		storage_dir %[6]s
		provider %[7]s {
			api_endpoint %[8]s
			api_key %[9]s
		}
		poll {
			after 1s
			interval 5s
		}
	}
}
%[10]s:%[3]s {
	tls internal
	pingback_track {
		provider %[7]s
		pingback_url http://localhost:%[2]s/cb
	}
	reverse_proxy %[11]s
}
http://localhost:%[2]s {
	handle /cb {
		pingback {
			provider %[7]s
		}
		reverse_proxy %[12]s
	}
	respond 404
}
`, testAdmin, testHTTPPort, npmHTTPSPort, caddyData, logFile, t.TempDir(), tc.provider, sim.url, captchasim.DefaultKey,
				tc.host, strings.TrimPrefix(sim.url, "http://"), app.hostPort()))
			t.Cleanup(func() {
				unloadCaddy(t)
				if t.Failed() {
					logTail(t, logFile, 60)
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
			for _, r := range app.requests() {
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
			if r := app.requests()[0]; r.Header.Get(HeaderSource) != "poll" {
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
	waitFor(t, 30*time.Second, "Caddy's certificate for "+host, func() bool {
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
