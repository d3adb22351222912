package drill

import (
	"net"
	"net/http"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddy-pingback/pingback/internal/captchasim"
)

// drillSim is one provider's simulator as the drill serves it: every
// pingback dropped (the drill sends its own), tasks solved at once, and an
// outage switch that answers result requests (res.php, getTaskResult) with
// an HTML 503 page, as a provider's broken front end does.
type drillSim struct {
	sim    *captchasim.Sim
	srv    *http.Server
	url    string
	outage atomic.Bool

	mu          sync.Mutex
	resultCalls int // result requests (res.php, getTaskResult) received
	outageCalls int // of them, answered with the outage page
}

// simFlavor is the simulator's JSON flavor for a provider.
func simFlavor(provider string) string {
	switch provider {
	case "capsolver":
		return captchasim.FlavorCapSolver
	case "2captcha", "rucaptcha":
		return captchasim.Flavor2Captcha
	}
	return captchasim.FlavorAntiCaptcha
}

func newDrillSim(provider string) (*drillSim, error) {
	sim, err := captchasim.New(captchasim.Config{
		Key: drillSimKey, Seed: uint64(time.Now().UnixNano()), DropRate: 1,
		ForgetAfter: -1, JSONFlavor: simFlavor(provider),
		PingbackMethod: map[bool]string{true: "GET", false: "POST"}[provider == "captchaai"],
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ds := &drillSim{sim: sim, url: "http://" + ln.Addr().String()}
	ds.srv = &http.Server{Handler: ds, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = ds.srv.Serve(ln) }()
	return ds, nil
}

func (ds *drillSim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch path.Base(r.URL.Path) {
	case "res.php", "getTaskResult":
		out := ds.outage.Load()
		ds.mu.Lock()
		ds.resultCalls++
		if out {
			ds.outageCalls++
		}
		ds.mu.Unlock()
		if out {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("<html><body><h1>503 Service Temporarily Unavailable</h1></body></html>"))
			return
		}
	}
	ds.sim.ServeHTTP(w, r)
}

// calls returns the result requests received and those answered 503.
func (ds *drillSim) calls() (total, outage int) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.resultCalls, ds.outageCalls
}

func (ds *drillSim) close() {
	_ = ds.srv.Close()
	_ = ds.sim.Close()
}
