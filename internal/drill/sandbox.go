package drill

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// drillRoute is one `pingback` handler of the config, as the drill reaches
// it in the sandbox.
type drillRoute struct {
	Server   string // the server's name in the config
	Host     string // the Host header the drill sends (from the host matcher)
	Path     string // the path the drill sends (from the path matcher)
	Provider string
	AckTime  time.Duration // ack_timeout in force
	Before   []string      // handlers before pingback in its handler list
	Addr     string        // sandbox listener, host:port
	// Verify is the verify mode in force in the sandbox: as configured
	// (token by default) for a provider the config has a pingback_track
	// for, whose tasks carry tokens; none otherwise.
	Verify  string
	handler map[string]any // the handler's JSON in the sandbox config
}

// Name is how output names the route: its host and path.
func (r *drillRoute) Name() string { return r.Host + r.Path }

// URL is the route's URL in the sandbox (the listener, the route's path).
func (r *drillRoute) URL() string { return "http://" + r.Addr + r.Path }

// pingbackURL is the route's pingback URL as a provider would be given it
// in the sandbox: its host name, the sandbox listener's port.
func (r *drillRoute) pingbackURL() string {
	_, port, _ := net.SplitHostPort(r.Addr)
	return "http://" + net.JoinHostPort(r.Host, port) + r.Path
}

// drillTrack is a pingback_track handler of the config: the drill submits
// its tasks through it, as the app would.
type drillTrack struct {
	Server, Host, Base, Provider string // Base: the path prefix in.php or createTask is sent under
	Addr                         string
}

// drillPolled is a provider the config polls (a provider block with an
// api_key), with the API family the drill submits its tasks through.
type drillPolled struct {
	Provider string
	API      protocol.API
	Route    *drillRoute // the pingback route its results are delivered to
	Track    *drillTrack // the config's pingback_track for it; nil: tasks are registered on the admin API
}

// sandbox is the rewritten config and what the drill learnt from it.
type sandbox struct {
	Source     string // the user's config file
	JSON       map[string]any
	Routes     []*drillRoute
	Tracks     []*drillTrack
	Polled     []*drillPolled
	AdminAddr  string
	Dir        string  // temporary directory: store, data, config, logs
	Scale      float64 // timer scale (1: real timers)
	FirstPoll  time.Duration
	Interval   time.Duration
	BackoffMax time.Duration
	Notes      []string // what was changed that the user should know
	Upstreams  []string // with --app: the app's own upstreams, by drillUpstreamHeader
	ownPorts   map[string]bool
	defaults   Defaults
}

// drillError is a config the drill cannot rehearse (exit status 2).
type drillError struct{ msg string }

func (e *drillError) Error() string { return e.msg }

func cannotDrill(format string, args ...any) error {
	return &drillError{msg: fmt.Sprintf(format, args...)}
}

// adaptConfig reads and adapts the user's config to JSON, as `caddy run`
// would: adapter given, else json for *.json and caddyfile otherwise.
func adaptConfig(path, adapter string) (map[string]any, error) {
	body, err := os.ReadFile(path)
	if err != nil {
		return nil, cannotDrill("reading config: %v", err)
	}
	if adapter == "" {
		adapter = "caddyfile"
		if strings.HasSuffix(strings.ToLower(path), ".json") {
			adapter = "json"
		}
	}
	if adapter != "json" {
		a := caddyconfig.GetAdapter(adapter)
		if a == nil {
			return nil, cannotDrill("unknown config adapter %q", adapter)
		}
		out, _, err := a.Adapt(body, map[string]any{"filename": path})
		if err != nil {
			return nil, cannotDrill("adapting config with %s: %v", adapter, err)
		}
		body = out
	}
	var cfg map[string]any
	if err := json.Unmarshal(body, &cfg); err != nil {
		return nil, cannotDrill("config is not JSON: %v", err)
	}
	return cfg, nil
}

// obj returns m[k] as an object, creating it when create is set.
func obj(m map[string]any, k string, create bool) map[string]any {
	if v, ok := m[k].(map[string]any); ok {
		return v
	}
	if !create {
		return nil
	}
	v := map[string]any{}
	m[k] = v
	return v
}

func strList(v any) []string {
	l, _ := v.([]any)
	var out []string
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// jsonDuration reads a caddy.Duration from decoded JSON (string or ns).
func jsonDuration(v any) (time.Duration, bool) {
	switch x := v.(type) {
	case string:
		d, err := caddy.ParseDuration(x)
		return d, err == nil
	case float64:
		return time.Duration(x), true
	}
	return 0, false
}

// freePort returns a free loopback address that is none of the config's
// own ports.
func (sb *sandbox) freePort() (string, error) {
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		_, port, _ := net.SplitHostPort(addr)
		if !sb.ownPorts[port] {
			return addr, nil
		}
	}
	return "", errors.New("no free loopback port")
}

// configPorts lists the ports the config itself binds or calls: listeners,
// admin, provider endpoints. The sandbox takes none of them.
func configPorts(cfg map[string]any) map[string]bool {
	ports := map[string]bool{"2019": true, "80": true, "443": true}
	add := func(addr string) {
		if i := strings.LastIndex(addr, ":"); i >= 0 {
			p := strings.TrimSuffix(addr[i+1:], "/")
			if j := strings.Index(p, "-"); j > 0 {
				p = p[:j]
			}
			if _, err := strconv.Atoi(p); err == nil {
				ports[p] = true
			}
		}
	}
	if a := obj(cfg, "admin", false); a != nil {
		if s, ok := a["listen"].(string); ok {
			add(s)
		}
	}
	apps := obj(cfg, "apps", false)
	if apps == nil {
		return ports
	}
	for _, s := range obj(obj(apps, "http", false), "servers", false) {
		if srv, ok := s.(map[string]any); ok {
			for _, l := range strList(srv["listen"]) {
				add(l)
			}
		}
	}
	for _, p := range obj(obj(apps, "pingback", false), "providers", false) {
		if pc, ok := p.(map[string]any); ok {
			for _, k := range []string{"endpoint", "api_endpoint"} {
				if s, ok := pc[k].(string); ok {
					add(strings.TrimPrefix(strings.TrimPrefix(s, "http://"), "https://"))
				}
			}
		}
	}
	return ports
}

// drillOptions are the command's choices that shape the sandbox.
type drillOptions struct {
	realTimers bool
	app        bool     // keep the real upstreams
	defaults   Defaults // what the config's unset fields mean
}

// newSandbox rewrites cfg for the drill: servers on free loopback ports
// without TLS, admin on a free port, a temporary Badger store, the
// providers' endpoints and pingback_track upstreams pointed at the
// simulator (simURL per provider), the pingback routes' upstreams at the
// stand-in app (standin), timers scaled unless realTimers.
func newSandbox(source string, cfg map[string]any, opt drillOptions, standin string, simURL func(provider string) string) (*sandbox, error) {
	sb := &sandbox{Source: source, JSON: cfg, Scale: 1, ownPorts: configPorts(cfg), defaults: opt.defaults}
	apps := obj(cfg, "apps", true)
	httpApp := obj(apps, "http", false)
	servers := obj(httpApp, "servers", false)
	if len(servers) == 0 {
		return nil, cannotDrill("the config has no HTTP server, so no pingback route to rehearse")
	}
	pb := obj(apps, "pingback", true)

	// The providers: known names only; polled ones have an api_key.
	provs := obj(pb, "providers", false)
	var polledNames []string
	for name, v := range provs {
		if _, ok := protocol.Lookup(name); !ok {
			return nil, cannotDrill("unknown provider %q in the pingback app (known: %s)", name, protocol.NameList())
		}
		pc, _ := v.(map[string]any)
		if pc == nil {
			continue
		}
		if len(apiKeys(pc["api_key"])) > 0 {
			polledNames = append(polledNames, name)
		}
	}
	sort.Strings(polledNames)

	// Walk the routes: find pingback handlers, rewrite upstreams.
	names := make([]string, 0, len(servers))
	for n := range servers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		srv, _ := servers[n].(map[string]any)
		if srv == nil {
			continue
		}
		w := &routeWalker{sb: sb, server: n, opt: opt, standin: standin, simURL: simURL}
		if err := w.walk(srv["routes"], "", "", ""); err != nil {
			return nil, err
		}
	}
	if len(sb.Routes) == 0 {
		return nil, cannotDrill("the config has no pingback route (a `pingback` handler): nothing to rehearse")
	}
	for _, r := range sb.Routes {
		if _, ok := protocol.Lookup(r.Provider); !ok {
			return nil, cannotDrill("route %s: unknown provider %q (known: %s)", r.Name(), r.Provider, protocol.NameList())
		}
		sb.sandboxVerify(r)
	}

	// The temporary directory: store, Caddy's data and config, logs.
	dir, err := os.MkdirTemp("", "caddy-pingback-drill-")
	if err != nil {
		return nil, cannotDrill("temporary directory: %v", err)
	}
	sb.Dir = dir
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()

	// Listeners: one free loopback port per server, plain HTTP.
	for _, n := range names {
		srv, _ := servers[n].(map[string]any)
		if srv == nil {
			continue
		}
		addr, err := sb.freePort()
		if err != nil {
			return nil, cannotDrill("%v", err)
		}
		srv["listen"] = []any{addr}
		srv["automatic_https"] = map[string]any{"disable": true}
		for _, k := range []string{"tls_connection_policies", "listener_wrappers", "protocols", "logs", "listen_protocols"} {
			delete(srv, k)
		}
		for _, r := range sb.Routes {
			if r.Server == n {
				r.Addr = addr
			}
		}
		for _, t := range sb.Tracks {
			if t.Server == n {
				t.Addr = addr
			}
		}
	}
	delete(apps, "tls") // no certificates, no ACME
	delete(cfg, "logging")
	cfg["storage"] = map[string]any{"module": "file_system", "root": filepath.Join(dir, "caddy-data")}
	admin, err := sb.freePort()
	if err != nil {
		return nil, cannotDrill("%v", err)
	}
	sb.AdminAddr = admin
	cfg["admin"] = map[string]any{"listen": admin, "config": map[string]any{"persist": false}}

	// The store: always a temporary Badger directory.
	if st, ok := pb["store"].(map[string]any); ok {
		if m, _ := st["module"].(string); m != "" && m != "badger" {
			sb.Notes = append(sb.Notes, fmt.Sprintf("store %s replaced by a temporary Badger store (the drill never touches your store)", m))
		}
	}
	delete(pb, "store")
	pb["storage_dir"] = filepath.Join(dir, "store")

	// Providers: endpoints at the simulator, its key.
	for name, v := range provs {
		pc, _ := v.(map[string]any)
		if pc == nil {
			continue
		}
		p, _ := protocol.Lookup(name)
		if p.Has(protocol.Legacy) {
			pc["endpoint"] = simURL(name)
		}
		if p.Has(protocol.JSON) {
			pc["api_endpoint"] = simURL(name)
		}
		if _, has := pc["api_key"]; has {
			if n := len(apiKeys(pc["api_key"])); n > 1 {
				sb.Notes = append(sb.Notes, fmt.Sprintf("provider %s: its %d api_key keys replaced by the simulator's one key (the drill submits every task with it)", name, n))
			}
			pc["api_key"] = drillSimKey
		}
	}

	// Timers.
	sb.scaleTimers(pb, opt.realTimers)

	// The polled providers and the route their results go to.
	for _, name := range polledNames {
		var route *drillRoute
		for _, r := range sb.Routes {
			if r.Provider == name {
				route = r
				break
			}
		}
		p, _ := protocol.Lookup(name)
		api := protocol.JSON
		if p.Has(protocol.Legacy) {
			api = protocol.Legacy
		}
		var track *drillTrack
		for _, t := range sb.Tracks {
			if t.Provider == name {
				track = t
				break
			}
		}
		sb.Polled = append(sb.Polled, &drillPolled{Provider: name, API: api, Route: route, Track: track})
		if track == nil {
			sb.Notes = append(sb.Notes, fmt.Sprintf("provider %s: no pingback_track route in the config; the drill registers its tasks on the admin API (POST /pingback/tasks)", name))
		}
	}
	ok = true
	return sb, nil
}

// drillUpstreamHeader tells the stand-in, with --app, which of the app's
// upstreams a delivery goes to; the stand-in removes it before forwarding.
const drillUpstreamHeader = "X-Pingback-Drill-Upstream"

// apiKeys reads a provider's api_key from the JSON config: a string is
// one key ("" none), an array of strings several (empty entries left
// out); anything else is none (Caddy refuses it when the config loads).
// The keys are returned as written, placeholders unresolved.
func apiKeys(v any) []string {
	switch k := v.(type) {
	case string:
		if k != "" {
			return []string{k}
		}
	case []any:
		var keys []string
		for _, e := range k {
			if s, _ := e.(string); s != "" {
				keys = append(keys, s)
			}
		}
		return keys
	}
	return nil
}

// drillSimKey is the API key of the drill's simulators.
const drillSimKey = "5157cafe5157cafe5157cafe5157cafe"

// scaleTimers scales the pingback app's timers so that the first poll
// comes within about two seconds (at most a tenth of each timer), and
// records the values in force.
func (sb *sandbox) scaleTimers(pb map[string]any, real bool) {
	poll := obj(pb, "poll", true)
	replay := obj(pb, "replay", true)
	after, hasAfter := jsonDuration(poll["after"])
	def := sb.defaults
	first := def.AutoAfterMax
	if hasAfter && after > 0 {
		first = after
	}
	interval := def.PollInterval
	if d, ok := jsonDuration(poll["interval"]); ok && d > 0 {
		interval = d
	}
	backoffMin, backoffMax := def.BackoffMin, def.BackoffMax
	if d, ok := jsonDuration(replay["backoff_min"]); ok && d > 0 {
		backoffMin = d
		backoffMax = max(backoffMax, d)
	}
	if d, ok := jsonDuration(replay["backoff_max"]); ok && d > 0 {
		backoffMax = d
	}
	giveUp := def.GiveUp
	if d, ok := jsonDuration(poll["give_up"]); ok && d > 0 {
		giveUp = d
	}
	scale := 1.0
	if !real {
		scale = min(0.1, float64(2*time.Second)/float64(first))
	}
	sc := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	sb.Scale = scale
	sb.FirstPoll = sc(first)
	sb.Interval = sc(interval)
	sb.BackoffMax = sc(backoffMax)
	if scale == 1 {
		return
	}
	if hasAfter && after > 0 {
		poll["after"] = int64(sc(after))
	}
	poll["interval"] = int64(sc(interval))
	poll["give_up"] = int64(sc(giveUp))
	replay["backoff_min"] = int64(sc(backoffMin))
	replay["backoff_max"] = int64(sc(backoffMax))
	for _, v := range obj(pb, "providers", false) {
		if pc, ok := v.(map[string]any); ok {
			if d, ok := jsonDuration(pc["give_up"]); ok && d > 0 {
				pc["give_up"] = int64(sc(d))
			}
		}
	}
	sb.Notes = append(sb.Notes, fmt.Sprintf("timers scaled by %.3g (first poll %s, poll interval %s, replay backoff up to %s); --real-timers keeps them",
		scale, sb.FirstPoll, sb.Interval, sb.BackoffMax))
}

// routeWalker walks one server's routes in document order.
type routeWalker struct {
	sb      *sandbox
	server  string
	opt     drillOptions
	standin string
	simURL  func(string) string
}

// walk visits a route list; host and path are the matchers inherited from
// enclosing routes.
func (w *routeWalker) walk(v any, host, path, track string) error {
	routes, _ := v.([]any)
	for _, rv := range routes {
		r, _ := rv.(map[string]any)
		if r == nil {
			continue
		}
		h, p := host, path
		if ms, _ := r["match"].([]any); len(ms) > 0 {
			if m, _ := ms[0].(map[string]any); m != nil {
				if hs := strList(m["host"]); len(hs) > 0 {
					h = hs[0]
				}
				if ps := strList(m["path"]); len(ps) > 0 {
					p = ps[0]
				}
			}
		}
		handlers, _ := r["handle"].([]any)
		var before []string
		for _, hv := range handlers {
			hd, _ := hv.(map[string]any)
			if hd == nil {
				continue
			}
			name, _ := hd["handler"].(string)
			switch name {
			case "pingback":
				prov, _ := hd["provider"].(string)
				ack := w.sb.defaults.AckTimeout
				if prov == "anticaptcha" || prov == "capmonster" {
					ack = time.Second
				}
				if d, ok := jsonDuration(hd["ack_timeout"]); ok && d > 0 {
					ack = d
				}
				w.sb.Routes = append(w.sb.Routes, &drillRoute{
					Server: w.server, Host: sampleHost(h), Path: samplePath(p),
					Provider: prov, AckTime: ack, Before: append([]string(nil), before...),
					handler: hd,
				})
			case "pingback_track":
				track, _ = hd["provider"].(string)
				w.sb.Tracks = append(w.sb.Tracks, &drillTrack{Server: w.server, Host: sampleHost(h), Base: trackBase(p), Provider: track})
			case "reverse_proxy":
				w.rewriteProxy(hd, track)
			case "subroute":
				if err := w.walk(hd["routes"], h, p, track); err != nil {
					return err
				}
			}
			before = append(before, name)
		}
	}
	return nil
}

// rewriteProxy points a reverse_proxy at the simulator (after a
// pingback_track) or at the stand-in app; with --app the app's own
// upstreams stay and every request carries X-Pingback-Drill: 1.
func (w *routeWalker) rewriteProxy(hd map[string]any, track string) {
	dial := w.standin
	if track == "" && w.opt.app {
		// The stand-in sits in front of the app's own upstream (the
		// first one), so that faults can still be injected and what the
		// app accepted counted.
		ups, _ := hd["upstreams"].([]any)
		var real string
		if len(ups) > 0 {
			if u, _ := ups[0].(map[string]any); u != nil {
				real, _ = u["dial"].(string)
			}
		}
		scheme := "http"
		if tr := obj(hd, "transport", false); tr != nil && tr["tls"] != nil {
			scheme = "https"
		}
		w.sb.Upstreams = append(w.sb.Upstreams, scheme+"://"+real)
		set := obj(obj(obj(hd, "headers", true), "request", true), "set", true)
		set["X-Pingback-Drill"] = []any{"1"}
		set[drillUpstreamHeader] = []any{strconv.Itoa(len(w.sb.Upstreams) - 1)}
		hd["upstreams"] = []any{map[string]any{"dial": dial}}
		for _, k := range []string{"transport", "dynamic_upstreams", "health_checks", "load_balancing"} {
			delete(hd, k)
		}
		return
	}
	if track != "" {
		dial = strings.TrimPrefix(w.simURL(track), "http://")
	}
	hd["upstreams"] = []any{map[string]any{"dial": dial}}
	for _, k := range []string{"transport", "dynamic_upstreams", "health_checks", "load_balancing"} {
		delete(hd, k)
	}
	// The upstream's own Host would be the real provider's; keep the
	// request's.
	if hdrs := obj(hd, "headers", false); hdrs != nil {
		delete(hdrs, "request")
	}
}

// sampleHost is a Host header a host matcher matches: the name itself, a
// wildcard's label filled in; localhost without a matcher.
func sampleHost(h string) string {
	switch {
	case h == "":
		return "localhost"
	case strings.HasPrefix(h, "*."):
		return "drill" + h[1:]
	}
	return h
}

// trackBase is the path prefix a pingback_track's path matcher leaves for
// in.php and createTask: "/api/*" gives "/api", no matcher "".
func trackBase(p string) string {
	if strings.HasSuffix(p, "/*") {
		return strings.TrimSuffix(p, "/*")
	}
	return ""
}

// samplePath is a path a path matcher matches.
func samplePath(p string) string {
	if p == "" {
		return "/"
	}
	return strings.ReplaceAll(p, "*", "drill")
}

// sandboxVerify sets a route's verification in the sandbox. Most of the
// drill's pingbacks are made up (ids no submission produced), so
// unknown_ids is accept everywhere. A route whose provider the config has
// a pingback_track for keeps its verify mode (token by default): the
// drill's tasks for it go through pingback_track and carry tokens, its
// pingbacks for them carry the token too, and forged_pingback checks
// that a forgery is quarantined. Other routes verify nothing (verify
// none): their tasks have no tokens.
func (sb *sandbox) sandboxVerify(r *drillRoute) {
	tracked := slices.ContainsFunc(sb.Tracks, func(t *drillTrack) bool { return t.Provider == r.Provider })
	def := sb.defaults
	r.handler["unknown_ids"] = def.UnknownAccept
	if !tracked {
		r.handler["verify"], r.Verify = def.VerifyNone, def.VerifyNone
		sb.Notes = append(sb.Notes, fmt.Sprintf("route %s: verification off in the sandbox (verify none, unknown_ids accept): its provider has no pingback_track, so the drill's pingbacks carry no tokens", r.Name()))
		return
	}
	r.Verify, _ = r.handler["verify"].(string)
	if r.Verify == "" {
		r.Verify = def.VerifyToken
	}
	sb.Notes = append(sb.Notes, fmt.Sprintf("route %s: verify %s as configured, unknown_ids accept in the sandbox (the drill's other pingbacks are for made-up ids)", r.Name(), r.Verify))
}
