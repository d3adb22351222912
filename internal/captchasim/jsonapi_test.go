package captchasim

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// postJSON POSTs body to base/endpoint and decodes the JSON answer.
func postJSON(t *testing.T, base, endpoint, body string) (map[string]any, response) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/"+endpoint, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp := do(t, req)
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(resp.body))
	dec.UseNumber()
	if resp.status == http.StatusOK {
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("%s answer %q is not JSON: %v", endpoint, resp.body, err)
		}
	}
	return m, resp
}

// jsonHits records the bodies of callbacks.
type jsonHits struct {
	url  string
	mu   sync.Mutex
	got  []string
	ctyp []string
}

func startJSONReceiver(t *testing.T) *jsonHits {
	h := &jsonHits{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.got = append(h.got, string(b))
		h.ctyp = append(h.ctyp, r.Header.Get("Content-Type"))
		h.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	h.url = srv.URL + "/cb"
	return h
}

func (h *jsonHits) bodies() ([]string, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...), append([]string(nil), h.ctyp...)
}

func TestJSONAPIFlavors(t *testing.T) {
	for _, tc := range []struct {
		flavor       string
		stringID     bool
		callbackForm bool
	}{
		{FlavorAntiCaptcha, false, false},
		{FlavorCapSolver, true, false},
		{Flavor2Captcha, false, true},
	} {
		t.Run(tc.flavor, func(t *testing.T) {
			rc := startJSONReceiver(t)
			sim, base := startSim(t, Config{JSONFlavor: tc.flavor, SolveMin: never, SolveMax: never})
			created, _ := postJSON(t, base, "createTask", `{"clientKey":"`+testKey+`","task":{"type":"RecaptchaV2TaskProxyless","websiteURL":"https://a.example","websiteKey":"k"},"callbackUrl":"`+rc.url+`"}`)
			if created["errorId"] != json.Number("0") {
				t.Fatalf("createTask: %v", created)
			}
			var id string
			switch v := created["taskId"].(type) {
			case string:
				if !tc.stringID {
					t.Fatalf("taskId %q is a string", v)
				}
				id = v
			case json.Number:
				if tc.stringID {
					t.Fatalf("taskId %v is a number", v)
				}
				id = v.String()
			default:
				t.Fatalf("taskId %#v", v)
			}
			idJSON, _ := json.Marshal(created["taskId"])
			ask := `{"clientKey":"` + testKey + `","taskId":` + string(idJSON) + `}`
			if got, _ := postJSON(t, base, "getTaskResult", ask); got["status"] != "processing" || got["errorId"] != json.Number("0") {
				t.Errorf("before solving: %v", got)
			}
			if !sim.Solve(id) {
				t.Fatal("Solve failed")
			}
			got, _ := postJSON(t, base, "getTaskResult", ask)
			sol, _ := got["solution"].(map[string]any)
			info, _ := sim.Task(id)
			if got["status"] != "ready" || sol["gRecaptchaResponse"] != info.Code {
				t.Errorf("after solving: %v (want token %s)", got, info.Code)
			}
			testkit.WaitFor(t, 5*time.Second, "the callback", func() bool { b, _ := rc.bodies(); return len(b) == 1 })
			bodies, types := rc.bodies()
			if tc.callbackForm {
				if types[0] != "application/x-www-form-urlencoded" || !strings.HasPrefix(bodies[0], "id="+id+"&code=") {
					t.Errorf("form callback %s %q", types[0], bodies[0])
				}
				return
			}
			var cb map[string]any
			dec := json.NewDecoder(strings.NewReader(bodies[0]))
			dec.UseNumber()
			if err := dec.Decode(&cb); err != nil || types[0] != "application/json" {
				t.Fatalf("JSON callback %s %q: %v", types[0], bodies[0], err)
			}
			if tc.stringID && cb["taskId"] != id || !tc.stringID && cb["taskId"] != json.Number(id) || cb["status"] != "ready" {
				t.Errorf("callback %v", cb)
			}
		})
	}
}

func TestJSONAPIErrorsAndLimits(t *testing.T) {
	clock := newFakeClock()
	sim, base := startSim(t, Config{SolveMin: never, SolveMax: never, MaxResultCalls: 3, ForgetAfter: 5 * time.Minute, Now: clock.Now})
	if got, _ := postJSON(t, base, "createTask", `{"clientKey":"wrong","task":{"type":"T"}}`); got["errorCode"] != CodeKeyDoesNotExist || got["errorId"] != json.Number("1") {
		t.Errorf("wrong key: %v", got)
	}
	if got, _ := postJSON(t, base, "createTask", `{"clientKey":"`+testKey+`"}`); got["errorCode"] != CodeTaskAbsent {
		t.Errorf("no task: %v", got)
	}
	if got, _ := postJSON(t, base, "getTaskResult", `{"clientKey":"`+testKey+`","taskId":12345}`); got["errorCode"] != CodeNoSuchCaptchaID || got["errorId"] != json.Number("16") {
		t.Errorf("unknown task: %v", got)
	}
	if got, _ := postJSON(t, base, "getBalance", `{"clientKey":"`+testKey+`"}`); got["balance"] != json.Number("50.25") {
		t.Errorf("balance: %v", got)
	}
	created, _ := postJSON(t, base, "createTask", `{"clientKey":"`+testKey+`","task":{"type":"NoCaptchaTask"}}`)
	ask := `{"clientKey":"` + testKey + `","taskId":` + created["taskId"].(json.Number).String() + `}`
	for i := 1; i <= 4; i++ {
		got, _ := postJSON(t, base, "getTaskResult", ask)
		if want := i > 3; (got["errorCode"] == CodeTooMuchRequests) != want {
			t.Errorf("call %d: %v", i, got)
		}
	}
	if n := sim.Stats().ResultLimitExceeded; n != 1 {
		t.Errorf("ResultLimitExceeded %d, want 1", n)
	}
	clock.Advance(5 * time.Minute)
	if got, _ := postJSON(t, base, "getTaskResult", ask); got["errorCode"] != CodeNoSuchCaptchaID {
		t.Errorf("forgotten task: %v", got)
	}
	if _, resp := postJSON(t, base, "getTaskResult", "not json"); resp.status != http.StatusOK || !strings.Contains(resp.body, "errorId") {
		t.Errorf("malformed request: %d %q", resp.status, resp.body)
	}
}

func TestJSONAPICapSolverSynchronous(t *testing.T) {
	_, base := startSim(t, Config{JSONFlavor: FlavorCapSolver, SolveMin: never, SolveMax: never})
	got, _ := postJSON(t, base, "createTask", `{"clientKey":"`+testKey+`","task":{"type":"ImageToTextTask","body":"iVBOR"}}`)
	sol, _ := got["solution"].(map[string]any)
	if got["status"] != "ready" || sol["text"] == nil || got["taskId"] == nil {
		t.Errorf("synchronous answer %v", got)
	}
}

// FuzzJSONAPI: whatever body arrives, the JSON endpoints answer 200 with
// a JSON object (or an injected 5xx, off here) and never panic; the one
// solved task's result goes only to its own account's key, and the banned
// account gets only its ban.
func FuzzJSONAPI(f *testing.F) {
	sim, err := New(Config{Key: testKey, Keys: []string{otherKey, bannedKey}, SolveMin: never, SolveMax: never, JSONFlavor: FlavorCapSolver})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = sim.Close() })
	sim.mu.Lock()
	solved := sim.newTaskLocked(sim.accounts[0], "userrecaptcha", "", time.Now(), true).id
	sim.mu.Unlock()
	if !sim.Solve(solved) {
		f.Fatal("Solve failed")
	}
	if err := sim.BanKey(bannedKey); err != nil {
		f.Fatal(err)
	}
	f.Add("createTask", `{"clientKey":"`+testKey+`","task":{"type":"NoCaptchaTask"}}`)
	f.Add("getTaskResult", `{"clientKey":"`+testKey+`","taskId":10000000001}`)
	f.Add("getTaskResult", `{"clientKey":"`+testKey+`","taskId":"x"}`)
	f.Add("getBalance", `{}`)
	f.Add("createTask", `[`)
	f.Add("getTaskResult", `{"clientKey":"`+testKey+`","taskId":"`+solved+`"}`)
	f.Add("getTaskResult", `{"clientKey":"`+otherKey+`","taskId":"`+solved+`"}`)
	f.Add("getTaskResult", `{"clientKey":"`+bannedKey+`","taskId":"`+solved+`"}`)
	f.Add("createTask", `{"clientKey":"`+bannedKey+`","task":{"type":"ImageToTextTask"}}`)
	f.Fuzz(func(t *testing.T, endpoint, body string) {
		switch endpoint {
		case "createTask", "getTaskResult", "getBalance":
		default:
			endpoint = "getTaskResult"
		}
		w := httptest.NewRecorder()
		sim.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/"+endpoint, strings.NewReader(body)))
		var m map[string]any
		if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &m) != nil || m["errorId"] == nil {
			t.Fatalf("%s %q: %d %q", endpoint, body, w.Code, w.Body.String())
		}
		var req jsonRequest
		if json.Unmarshal([]byte(body), &req) != nil {
			return
		}
		if req.ClientKey == bannedKey && m["errorCode"] != CodeIPBlocked {
			t.Fatalf("banned key's %s %q answered %q", endpoint, body, w.Body.String())
		}
		if endpoint == "getTaskResult" && m["status"] == "ready" && req.ClientKey != testKey {
			t.Fatalf("result given to another key: %q answered %q", body, w.Body.String())
		}
	})
}
