package pingback

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/modules/caddypki"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/caddy-pingback/pingback/internal/pgtest"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/testkit"
)

// The tests in this file read the configs shown in the documentation at test
// time: every fenced ```caddyfile and ```json block of the repository's
// markdown files (README.md and the other root pages, and docs/*.md),
// Caddyfile.example and Caddyfile.postgres.example. A block is marked, if at all, by an
// HTML comment (invisible on GitHub) on the line before its fence:
//
//	<!-- syntax -->              a syntax reference with placeholders: not adapted
//	<!-- same-config: NAME -->   every block marked with NAME is the same config
//
// Every other block must adapt without warnings and pass caddy.Validate.

// docBlock is a config shown in the documentation.
type docBlock struct {
	file string
	line int    // of the opening fence (1 for a whole file)
	lang string // "caddyfile" or "json"
	text string
	mark string // the marker comment's text, "" if none
}

func (b docBlock) String() string { return fmt.Sprintf("%s:%d (%s)", b.file, b.line, b.lang) }

var (
	fenceOpen  = regexp.MustCompile("^\\s*```\\s*([A-Za-z0-9_-]*)\\s*$")
	markerLine = regexp.MustCompile(`^\s*<!--\s*(.*?)\s*-->\s*$`)
)

// markdownBlocks extracts the fenced caddyfile and json blocks of a markdown
// file, with the marker comment on the line before each fence.
func markdownBlocks(t *testing.T, file string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n")
	var blocks []docBlock
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		indent := lines[i][:strings.Index(lines[i], "```")]
		start := i
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			body = append(body, strings.TrimPrefix(lines[i], indent))
		}
		if i == len(lines) {
			t.Fatalf("%s:%d: fence never closed", file, start+1)
		}
		lang := strings.ToLower(m[1])
		if lang != "caddyfile" && lang != "json" {
			continue
		}
		mark := ""
		if start > 0 {
			if mm := markerLine.FindStringSubmatch(lines[start-1]); mm != nil {
				mark = mm[1]
			}
		}
		blocks = append(blocks, docBlock{file: file, line: start + 1, lang: lang, text: strings.Join(body, "\n") + "\n", mark: mark})
	}
	return blocks
}

// docFiles returns the documentation's markdown files: those of the
// repository's root (README.md, xcaddy.md, ...) and of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, pattern := range []string{"*.md", filepath.Join("docs", "*.md")} {
		matched, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, matched...)
	}
	if !slices.Contains(files, "README.md") || !slices.Contains(files, filepath.Join("docs", "configuration.md")) {
		t.Fatalf("the documentation's markdown files are not where they should be: %q", files)
	}
	return files
}

// docBlocks returns every config shown in the documentation.
func docBlocks(t *testing.T) []docBlock {
	t.Helper()
	var blocks []docBlock
	for _, f := range docFiles(t) {
		blocks = append(blocks, markdownBlocks(t, f)...)
	}
	for _, name := range []string{"Caddyfile.example", "Caddyfile.postgres.example"} {
		example, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, docBlock{file: name, line: 1, lang: "caddyfile", text: string(example)})
	}
	return blocks
}

// adaptDocBlock turns a block into JSON config: Caddyfiles through the
// Caddyfile adapter, whose warnings (an unformatted block, say) fail the test.
func adaptDocBlock(t *testing.T, b docBlock) []byte {
	t.Helper()
	if b.lang == "json" {
		if !json.Valid([]byte(b.text)) {
			t.Fatalf("%s is not valid JSON:\n%s", b, b.text)
		}
		return []byte(b.text)
	}
	cfg, warn, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(b.text), map[string]any{"filename": b.file})
	if err != nil {
		t.Fatalf("%s does not adapt: %v\n%s\n(a syntax reference that cannot adapt needs <!-- syntax --> on the line before its fence)", b, err, b.text)
	}
	for _, w := range warn {
		t.Errorf("%s: adapt warning: %s (line %d of the block)", b, w.Message, w.Line)
	}
	return cfg
}

func TestDocConfigsAdapt(t *testing.T) {
	// The PostgreSQL examples read their DSN from the environment;
	// validating never connects.
	t.Setenv("PINGBACK_DSN", "postgres://pingback@db.example:5432/pingback")
	blocks := docBlocks(t)
	var adapted, skipped int
	for _, b := range blocks {
		t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
			switch {
			case b.mark == "syntax":
				skipped++
				t.Skipf("%s is marked as a syntax reference", b)
			case b.mark != "" && !strings.HasPrefix(b.mark, "same-config:"):
				t.Fatalf("%s: unknown marker <!-- %s --> before the fence", b, b.mark)
			}
			cfg := adaptDocBlock(t, b)
			var c caddy.Config
			if err := caddy.StrictUnmarshalJSON(cfg, &c); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			if err := caddy.Validate(&c); err != nil {
				t.Fatalf("%s adapts but does not validate: %v", b, err)
			}
			adapted++
		})
	}
	// Guards against an extractor that silently finds nothing: README.md
	// shows the Caddyfile reference (skipped), docs/configuration.md the
	// JSON example with its Caddyfile form, and Caddyfile.example is always
	// there.
	if adapted < 3 || skipped < 1 {
		t.Errorf("adapted %d and skipped %d documentation configs; want at least 3 and 1", adapted, skipped)
	}
	for _, file := range []string{"README.md", filepath.Join("docs", "configuration.md"), filepath.Join("docs", "storage.md")} {
		if !slices.ContainsFunc(blocks, func(b docBlock) bool { return b.file == file }) {
			t.Errorf("%s shows no config: the extractor missed it, or its configs moved", file)
		}
	}
}

func TestDocConfigsSideBySideAreTheSame(t *testing.T) {
	groups := map[string][]docBlock{}
	for _, b := range docBlocks(t) {
		if name, ok := strings.CutPrefix(b.mark, "same-config:"); ok {
			groups[strings.TrimSpace(name)] = append(groups[strings.TrimSpace(name)], b)
		}
	}
	if len(groups) == 0 {
		t.Fatal("no <!-- same-config: NAME --> blocks in the documentation")
	}
	for name, blocks := range groups {
		t.Run(name, func(t *testing.T) {
			if len(blocks) < 2 {
				t.Fatalf("same-config %q marks only %s", name, blocks[0])
			}
			want := canonicalConfig(t, adaptDocBlock(t, blocks[0]))
			for _, b := range blocks[1:] {
				if got := canonicalConfig(t, adaptDocBlock(t, b)); !reflect.DeepEqual(got, want) {
					t.Errorf("%s and %s are not the same config:\n%s\n%s", blocks[0], b, indentJSON(want), indentJSON(got))
				}
			}
		})
	}
}

// canonicalConfig decodes a JSON config and passes every app and every HTTP
// handler through its module's Go type (strictly, so unknown fields fail),
// so that equal settings compare equal whatever their spelling: "2s" and
// 2000000000, key order, omitted zero values.
func canonicalConfig(t *testing.T, cfg []byte) any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(cfg, &v); err != nil {
		t.Fatal(err)
	}
	v = canonicalValue(t, v).(map[string]any)
	if apps, ok := v["apps"].(map[string]any); ok {
		for name, app := range apps {
			apps[name] = throughModule(t, name, app)
		}
	}
	return v
}

func canonicalValue(t *testing.T, v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = canonicalValue(t, e)
		}
		if h, ok := x["handler"].(string); ok {
			// The module name is the inline key, not a field of the module.
			delete(x, "handler")
			m := throughModule(t, "http.handlers."+h, x).(map[string]any)
			m["handler"] = h
			return m
		}
	case []any:
		for i, e := range x {
			x[i] = canonicalValue(t, e)
		}
	}
	return v
}

// throughModule unmarshals v into a new value of the module and marshals it
// back.
func throughModule(t *testing.T, id string, v any) any {
	t.Helper()
	info, err := caddy.GetModule(id)
	if err != nil {
		t.Fatalf("module %s: %v", id, err)
	}
	in, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	m := info.New()
	if err := caddy.StrictUnmarshalJSON(in, m); err != nil {
		t.Fatalf("module %s: %v\n%s", id, err, in)
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back any
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	return back
}

func indentJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

// TestDocJSONExampleServes runs each JSON config of the documentation that
// has a pingback route, as written but for the addresses (a free loopback
// port, a temp storage dir, a loopback app, certificates from Caddy's
// internal CA instead of an ACME CA), and sends that route a pingback over
// HTTPS with the example's host name.
func TestDocJSONExampleServes(t *testing.T) {
	var found bool
	for _, b := range docBlocks(t) {
		if b.lang != "json" || b.mark == "syntax" || !strings.Contains(b.text, `"pingback"`) {
			continue
		}
		var cfg map[string]any
		if err := json.Unmarshal([]byte(b.text), &cfg); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		route := pingbackRouteOf(cfg)
		if route.provider == "" {
			continue // a pingback app without a pingback route
		}
		found = true
		t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
			if len(route.hosts) != 1 || len(route.paths) != 1 {
				t.Fatalf("%s: want one host and one path matcher for its pingback route, got hosts %q paths %q "+
					"(a JSON example on :443 needs a host matcher: automatic HTTPS has no other name to get a certificate for)",
					b, route.hosts, route.paths)
			}
			host, path := route.hosts[0], route.paths[0]
			app := newAppStub(t)
			port := freePort(t)
			loadJSON(t, servableConfig(t, cfg, port, app))
			t.Cleanup(func() { unloadCaddy(t) })

			client := tlsClientTo(t, "127.0.0.1:"+strconv.Itoa(port), host)
			testkit.WaitFor(t, 30*time.Second, "a certificate for "+host, func() bool {
				resp, err := client.Get("https://" + host + "/")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return true
			})
			status, body := sendPingback(t, client, route.provider, "https://"+host+path, "7301", "DOC-TOKEN")
			if status != http.StatusOK || body != "OK" {
				t.Fatalf("pingback to https://%s%s: got %d %q, want 200 OK", host, path, status, body)
			}
			key := route.provider + ":7301"
			testkit.WaitFor(t, 5*time.Second, "the app to receive the pingback", func() bool { return app.Count(key) == 1 })
			if got := app.Requests()[0].Host; got != host {
				t.Errorf("app got Host %q, want %q", got, host)
			}

			// Why the host matcher is there: without it the same config
			// validates, but automatic HTTPS has no name to get a
			// certificate for and every TLS handshake fails.
			loadJSON(t, servableConfig(t, withoutHostMatchers(cfg), port, app))
			conn, err := tls.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port), &tls.Config{ServerName: host, InsecureSkipVerify: true})
			if err == nil {
				conn.Close()
				t.Fatalf("without its host matcher the example still completed a TLS handshake for %s", host)
			}
		})
	}
	if !found {
		t.Fatal("no JSON config with a pingback route in the documentation")
	}
}

// pingbackRoute is what a config says about its pingback route.
type pingbackRoute struct {
	provider     string
	hosts, paths []string
}

// pingbackRouteOf collects the pingback handler's provider and the host
// and path matchers of the config's HTTP routes.
func pingbackRouteOf(cfg map[string]any) pingbackRoute {
	var r pingbackRoute
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if x["handler"] == "pingback" {
				r.provider, _ = x["provider"].(string)
			}
			for _, key := range []string{"host", "path"} {
				if list, ok := x[key].([]any); ok {
					for _, s := range list {
						if s, ok := s.(string); ok && key == "host" {
							r.hosts = append(r.hosts, s)
						} else if ok {
							r.paths = append(r.paths, s)
						}
					}
				}
			}
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(x[k])
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(cfg["apps"])
	return r
}

// servableConfig returns a copy of cfg with its listeners on a loopback
// port, its storage in temp dirs, every upstream replaced by app, and
// certificates for the route's hosts from Caddy's internal CA.
func servableConfig(t *testing.T, cfg map[string]any, port int, app *testkit.App) []byte {
	t.Helper()
	var c map[string]any
	mustRoundTrip(t, cfg, &c)
	apps := c["apps"].(map[string]any)
	c["admin"] = map[string]any{"listen": testAdmin, "config": map[string]any{"persist": false}}
	c["storage"] = map[string]any{"module": "file_system", "root": t.TempDir()}
	if pb, ok := apps["pingback"].(map[string]any); ok {
		if st, _ := pb["store"].(map[string]any); st != nil && st["module"] == "postgres" {
			// The example's PostgreSQL store, on the test database.
			dsn := pgtest.DSN(t)
			pb["store"] = map[string]any{"module": "postgres", "dsn": dsn, "schema": pgtest.Schema(t, dsn)}
		} else {
			pb["storage_dir"] = t.TempDir()
		}
	}
	httpApp := apps["http"].(map[string]any)
	httpApp["http_port"] = freePort(t)
	httpApp["https_port"] = port
	httpApp["grace_period"] = 1
	for _, srv := range httpApp["servers"].(map[string]any) {
		srv := srv.(map[string]any)
		srv["listen"] = []any{"127.0.0.1:" + strconv.Itoa(port)}
	}
	replaceDials(httpApp, app.HostPort())
	if _, ok := apps["tls"]; ok {
		t.Fatal("the example has a tls app; this test would replace it")
	}
	apps["tls"] = map[string]any{"automation": map[string]any{"policies": []any{
		map[string]any{"issuers": []any{map[string]any{"module": "internal"}}},
	}}}
	apps["pki"] = map[string]any{"certificate_authorities": map[string]any{"local": map[string]any{"install_trust": false}}}
	out, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// replaceDials sets every upstream's dial address in the decoded JSON v
// to dial.
func replaceDials(v any, dial string) {
	eachJSONObject(v, func(x map[string]any) {
		if _, ok := x["dial"]; ok {
			x["dial"] = dial
		}
	})
}

// withoutHostMatchers returns a copy of cfg whose matcher sets have no
// host matcher.
func withoutHostMatchers(cfg map[string]any) map[string]any {
	var c map[string]any
	b, _ := json.Marshal(cfg)
	_ = json.Unmarshal(b, &c)
	eachJSONObject(c, func(x map[string]any) { delete(x, "host") })
	return c
}

func mustRoundTrip(t *testing.T, in, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
}

// loadJSON loads a JSON config in-process.
func loadJSON(t *testing.T, cfg []byte) {
	t.Helper()
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading config: %v\n%s", err, cfg)
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// tlsClientTo returns a client that sends every request to addr, for host,
// trusting only the running config's internal CA.
func tlsClientTo(t *testing.T, addr, host string) *http.Client {
	t.Helper()
	v, err := caddy.ActiveContext().App("pki")
	if err != nil {
		t.Fatalf("pki app: %v", err)
	}
	ca, ok := v.(*caddypki.PKI).CAs[caddypki.DefaultCAID]
	if !ok {
		t.Fatal("no local CA")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.RootCertificate())
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: host},
		DisableKeepAlives: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// sendPingback sends a pingback as the provider does: a GET query for
// CaptchaAI, an urlencoded POST otherwise.
func sendPingback(t *testing.T, client *http.Client, provider, target, id, code string) (int, string) {
	t.Helper()
	form := url.Values{"id": {id}, "code": {code}}
	var resp *http.Response
	var err error
	if provider == "captchaai" {
		resp, err = client.Get(target + "?" + form.Encode())
	} else {
		resp, err = client.PostForm(target, form)
	}
	if err != nil {
		t.Fatalf("pingback to %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// exampleSite returns the site block of Caddyfile.example that starts with
// the given address line.
func exampleSite(t *testing.T, address string) string {
	t.Helper()
	data, err := os.ReadFile("Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\r\n", "\n")
	start := strings.Index(text, "\n"+address+" {\n")
	if start < 0 {
		t.Fatalf("Caddyfile.example has no site %q", address)
	}
	end := strings.Index(text[start+1:], "\n}\n")
	if end < 0 {
		t.Fatalf("Caddyfile.example: site %q never closes", address)
	}
	return text[start+1 : start+1+end+3]
}

// TestExampleCatchAllSite runs the catch-all site at the end of
// Caddyfile.example (moved to the test port, its access log written to a
// file) and checks that requests for hosts no site serves get 404 and that
// those looking like pingbacks are logged at WARN level with host and path
// and without their code.
func TestExampleCatchAllSite(t *testing.T) {
	site := exampleSite(t, "http://:8080")
	logFile := filepath.Join(t.TempDir(), "access.log")
	site = strings.Replace(site, "http://:8080 {", "http://:"+testHTTPPort+" {", 1)
	if !strings.Contains(site, "\n\tlog {\n") {
		t.Fatalf("the catch-all site has no log block:\n%s", site)
	}
	site = strings.Replace(site, "\n\tlog {\n", "\n\tlog {\n\t\toutput file "+logFile+"\n", 1)
	startCaddy(t, "", site)

	const code = "SECRET-CODE-9"
	tests := []struct {
		name     string
		method   string
		path     string
		ctype    string
		body     string
		wantWarn bool
	}{
		{"get query", "GET", "/pingback/captchaai?id=11&code=" + code, "", "", true},
		{"post form", "POST", "/pingback/2captcha", "application/x-www-form-urlencoded", "id=12&code=" + code, true},
		{"post multipart", "POST", "/pingback/rucaptcha", "multipart/form-data; boundary=XyZ",
			"--XyZ\r\nContent-Disposition: form-data; name=\"id\"\r\n\r\n13\r\n--XyZ\r\nContent-Disposition: form-data; name=\"code\"\r\n\r\n" + code + "\r\n--XyZ--\r\n", true},
		{"json taskId", "POST", "/callback", "application/json", `{"taskId":14,"status":"ready","solution":{"token":"` + code + `"}}`, true},
		{"id without code", "GET", "/pingback/typo?id=15", "", "", false},
		{"not a pingback", "GET", "/favicon.ico", "", "", false},
		{"form without id", "POST", "/login", "application/x-www-form-urlencoded", "user=a&code=" + code, false},
	}
	for _, tt := range tests {
		req, err := http.NewRequest(tt.method, testBase+tt.path, strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "unserved.example"
		if tt.ctype != "" {
			req.Header.Set("Content-Type", tt.ctype)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: got %d, want 404", tt.name, resp.StatusCode)
		}
	}

	var entries []accessEntry
	testkit.WaitFor(t, 5*time.Second, "an access log line per request", func() bool {
		entries = readAccessLog(t, logFile)
		return len(entries) >= len(tests)
	})
	if len(entries) != len(tests) {
		t.Fatalf("got %d access log lines, want %d", len(entries), len(tests))
	}
	// Lines may be written in another order than the requests were answered.
	byPath := map[string]accessEntry{}
	for _, e := range entries {
		path, _, _ := strings.Cut(e.URI, "?")
		byPath[path] = e
	}
	for _, tt := range tests {
		path, _, _ := strings.Cut(tt.path, "?")
		e, ok := byPath[path]
		if !ok {
			t.Errorf("%s: no access log line names the path %s", tt.name, path)
			continue
		}
		if e.Host != "unserved.example" {
			t.Errorf("%s: the log line names host %q, want unserved.example", tt.name, e.Host)
		}
		if e.Warn != tt.wantWarn {
			t.Errorf("%s: WARN level is %v, want %v: %s", tt.name, e.Warn, tt.wantWarn, e.Raw)
		}
		if strings.Contains(e.Raw, code) {
			t.Errorf("%s: the log line holds the code: %s", tt.name, e.Raw)
		}
	}
}

// accessEntry is one line of a console-format access log.
type accessEntry struct {
	Warn      bool
	Host, URI string
	Raw       string
}

func readAccessLog(t *testing.T, file string) []accessEntry {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		t.Fatal(err)
	}
	var out []accessEntry
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Split(line, "\t")
		if len(fields) < 4 {
			t.Fatalf("not a console log line: %q", line)
		}
		var e struct {
			Request struct {
				Host string `json:"host"`
				URI  string `json:"uri"`
			} `json:"request"`
		}
		if err := json.Unmarshal([]byte(fields[len(fields)-1]), &e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, accessEntry{Warn: strings.Contains(fields[1], "WARN"), Host: e.Request.Host, URI: e.Request.URI, Raw: line})
	}
	return out
}

// TestDocPageSizes: README.md is the front door (what and why, install, the
// quick start, one Caddyfile block per directive, links) and stays short;
// the rest lives in docs/ by topic. The benchmark page keeps the current
// figures, not their history.
func TestDocPageSizes(t *testing.T) {
	for _, tc := range []struct {
		file     string
		maxLines int
	}{
		{"README.md", 320},
		{filepath.Join("docs", "benchmarks.md"), 320},
	} {
		data, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(data), "\n"); n > tc.maxLines {
			t.Errorf("%s has %d lines, want at most %d: move the detail to a page of docs/", tc.file, n, tc.maxLines)
		}
	}
	if _, err := os.Stat("BENCHMARKS.md"); err == nil {
		t.Error("BENCHMARKS.md is back: the benchmarks live in docs/benchmarks.md")
	}
}

var (
	mdLink    = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	mdHeading = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	slugDrop  = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

// markdownAnchors returns the anchors GitHub gives the headings of a
// markdown file (fenced blocks skipped): lower case, punctuation dropped,
// spaces turned into hyphens, "-1", "-2" appended to repeats.
func markdownAnchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		m := mdHeading.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		slug := strings.ReplaceAll(slugDrop.ReplaceAllString(strings.ToLower(m[2]), ""), " ", "-")
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}

// describedNames records the metric names of the collectors registered
// with it (from their descriptions, so empty vectors count too).
type describedNames struct{ names []string }

var descName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describedNames) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for desc := range ch {
		if m := descName.FindStringSubmatch(desc.String()); m != nil {
			d.names = append(d.names, m[1])
		}
	}
	return nil
}

func (d *describedNames) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *describedNames) Unregister(prometheus.Collector) bool { return false }

// TestDocMetrics: every metric the plugin registers is named in
// docs/operations.md, where the metrics are documented.
func TestDocMetrics(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var d describedNames
	if _, err := registerMetrics(&d); err != nil {
		t.Fatal(err)
	}
	if len(d.names) < 20 {
		t.Fatalf("registerMetrics described %d metrics (%v), want every one", len(d.names), d.names)
	}
	for _, name := range d.names {
		if !strings.Contains(string(data), "`"+name) {
			t.Errorf("%s is not documented in docs/operations.md", name)
		}
	}
}

// TestDocLinks: every relative link of README.md and docs/*.md names a
// file of the repository and, after a #, a heading of that file, so that
// the text that moved between pages is still where its links say.
func TestDocLinks(t *testing.T) {
	var checked int
	for _, file := range docFiles(t) {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for i, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inFence = !inFence
				continue
			}
			if inFence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				}
				checked++
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", file, i+1, target, dest)
					continue
				}
				if anchor != "" && !markdownAnchors(t, dest)[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with the anchor #%s", file, i+1, target, dest, anchor)
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d links; the documentation has more", checked)
	}
}

// TestReadmeVerificationFacts: the documentation (README.md and docs/*.md)
// states verification's facts once (the Verification section of
// docs/security.md; its security sections link to it) and with the code's
// values: the token's name, res_php's retries, the quarantine's default caps
// and metric, the release endpoint and the correction key.
func TestReadmeVerificationFacts(t *testing.T) {
	var all strings.Builder
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
		all.WriteString("\n")
	}
	docs := strings.Join(strings.Fields(all.String()), " ") // line breaks do not matter
	for _, tc := range []struct {
		fact string
		want int // occurrences: 1 for "said once", -1 for "at least once"
	}{
		{fmt.Sprintf("asked again %d times, %d s apart", confirmTries, confirmGap/time.Second), -1},
		{fmt.Sprintf("`max_quarantine`, default %d results and %d MiB", DefaultMaxQuarantine, DefaultMaxQuarantineBytes>>20), 1},
		{"`" + protocol.TokenParam + "=<32 hex digits>`", 1},
		{protocol.TokenParam + "=" + redactedValue, -1},
		{"`caddy_pingback_quarantine_bytes{provider}`", -1},
		{`callbacks_total{result="quarantine_full"}`, -1},
		{"`Idempotency-Key: <provider>:<id>:correction`", 1},
		{"`POST /pingback/records/<provider>/<id>/release`", -1},
		{"without a token (registered through the admin API", 1}, // where such tasks go
		{"over about 15 s", 0}, // the old, wrong wording
		{"](#verification-tokens-quarantine-corrections)", -1},
	} {
		n := strings.Count(docs, tc.fact)
		if (tc.want < 0 && n == 0) || (tc.want >= 0 && n != tc.want) {
			t.Errorf("the documentation says %q %d times, want %d (-1: at least once)", tc.fact, n, tc.want)
		}
	}
	b, err := os.ReadFile(filepath.Join("docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	page := strings.Join(strings.Fields(string(b)), " ")
	if !strings.Contains(page, "## Verification: tokens, quarantine, corrections") {
		t.Fatal("docs/security.md has no Verification section")
	}
	start := strings.Index(page, "## Who can reach what")
	if start < 0 {
		t.Fatal("docs/security.md has no security sections (## Who can reach what)")
	}
	if sec := page[start:]; !strings.Contains(sec, "[Verification](#verification-tokens-quarantine-corrections)") {
		t.Error("the security sections of docs/security.md do not link to Verification")
	}
}

// archPath is a backticked name in ARCHITECTURE.md that names a file or a
// folder: it has a slash or a file extension, and no space.
var archPath = regexp.MustCompile("`([A-Za-z0-9_.*/-]+(?:/|\\.go|\\.md|\\.sh|\\.yml))`|`((?:internal|cmd|bench|docs|testdata)/[A-Za-z0-9_./-]*)`")

// TestArchitectureCodeMap: ARCHITECTURE.md is the map of the code, so
// every path it names exists (a name in a row of a package resolves in
// that package's folder; a pattern such as badger*.go matches a file), and
// every non-test Go file of the root package has its row in the code map.
func TestArchitectureCodeMap(t *testing.T) {
	data, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	exists := func(p string) bool {
		matches, err := filepath.Glob(filepath.FromSlash(strings.TrimSuffix(p, "/")))
		return err == nil && len(matches) > 0
	}
	mapped := map[string]bool{}
	var named int
	for i, line := range strings.Split(string(data), "\n") {
		var dirs []string // the packages a table row is about
		if strings.HasPrefix(line, "| `internal/") || strings.HasPrefix(line, "| `cmd/") {
			dirs = append(dirs, strings.Trim(strings.Fields(line)[1], "`"))
		}
		if m := regexp.MustCompile("^\\| `([a-z_]+\\.go)` \\|").FindStringSubmatch(line); m != nil {
			mapped[m[1]] = true
		}
		for _, m := range archPath.FindAllStringSubmatch(line, -1) {
			p := m[1] + m[2]
			if strings.HasPrefix(p, "/") || strings.HasPrefix(p, ".") && !strings.HasPrefix(p, ".ci/") {
				continue // an admin API path or an extension
			}
			named++
			found := exists(p)
			for _, d := range dirs {
				found = found || exists(path.Join(d, p))
			}
			if !found {
				t.Errorf("ARCHITECTURE.md:%d names %s, which does not exist", i+1, p)
			}
		}
	}
	if named < 40 {
		t.Errorf("ARCHITECTURE.md names %d paths; its code map names more", named)
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") && !mapped[f] {
			t.Errorf("%s is not in ARCHITECTURE.md's code map (a row | `%s` | of the root package's table)", f, f)
		}
	}
	for f := range mapped {
		if !slices.Contains(files, f) {
			t.Errorf("ARCHITECTURE.md's code map has a row for %s, which is not a file of the root package", f)
		}
	}
}

// goFileName is a Go file's name (a word, then the extension .go) in a
// comment's text: a comment names identifiers instead, which do not go
// stale when code moves between files.
var goFileName = regexp.MustCompile(`\b[A-Za-z0-9_]+\.go\b`)

// TestGoCommentsNameNoFiles: no comment of a Go file of the repository
// names a Go file (testdata, node_modules and .git are left out). A
// directive (//go:build, //go:embed, ...) is no such comment, nor is a URL
// (a link into another project's source at a version), and a comment may
// name other files, such as docs/storage.md.
func TestGoCommentsNameNoFiles(t *testing.T) {
	url := regexp.MustCompile(`\bhttps?://\S+`)
	fset := token.NewFileSet()
	var files int
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, group := range f.Comments {
			for _, c := range group.List {
				if strings.HasPrefix(c.Text, "//go:") {
					continue
				}
				for i, line := range strings.Split(c.Text, "\n") {
					if name := goFileName.FindString(url.ReplaceAllString(line, "")); name != "" {
						pos := fset.Position(c.Pos())
						t.Errorf("%s:%d: a comment names the file %s; name an identifier (a Go doc link such as [App.deliver]): %s",
							filepath.ToSlash(pos.Filename), pos.Line+i, name, strings.TrimSpace(line))
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Errorf("read %d Go files; the repository has more", files)
	}
}
