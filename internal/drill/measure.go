package drill

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// drillMeasure is what --measure-provider found.
type drillMeasure struct {
	// Endpoints: the balance request's round trip per configured provider
	// endpoint.
	Endpoints []endpointTiming `json:"endpoints"`
	// Delays: pingback delays of a running instance's tracked tasks
	// (--address), or why they could not be read.
	Delays *pingbackDelays `json:"pingback_delays,omitempty"`
}

type endpointTiming struct {
	Provider string  `json:"provider"`
	URL      string  `json:"url"`
	Samples  int     `json:"samples"`
	Errors   int     `json:"errors"`
	P50      float64 `json:"p50_seconds"`
	P95      float64 `json:"p95_seconds"`
	Error    string  `json:"error,omitempty"`
}

type pingbackDelays struct {
	Address string  `json:"address"`
	Tasks   int     `json:"tasks"`
	P50     float64 `json:"p50_seconds"`
	P95     float64 `json:"p95_seconds"`
	Max     float64 `json:"max_seconds"`
	// SuggestedAfter is 1.5 × p95, clamped to [20s, 120s]: the poll
	// after value the delays suggest (what `after auto` would use).
	SuggestedAfter string `json:"suggested_poll_after,omitempty"`
	Error          string `json:"error,omitempty"`
}

// measureProviders times the free balance request to every provider
// endpoint of the config (legacy res.php?action=getbalance, JSON
// getBalance), samples times each, and reads the pingback delays of a
// running instance when address is given (its suggested after within
// def's `after auto` bounds).
func measureProviders(ctx context.Context, cfg map[string]any, samples int, address string, def Defaults, progress io.Writer) *drillMeasure {
	m := &drillMeasure{}
	provs := obj(obj(obj(cfg, "apps", false), "pingback", false), "providers", false)
	names := make([]string, 0, len(provs))
	for n := range provs {
		names = append(names, n)
	}
	sort.Strings(names)
	repl := caddy.NewReplacer()
	client := &http.Client{Timeout: 15 * time.Second}
	for _, name := range names {
		pc, _ := provs[name].(map[string]any)
		p, ok := protocol.Lookup(name)
		if pc == nil || !ok {
			continue
		}
		apiKey := ""
		for _, k := range apiKeys(pc["api_key"]) {
			if apiKey = repl.ReplaceAll(k, ""); apiKey != "" {
				break // any of the provider's keys answers a balance request
			}
		}
		for _, api := range []protocol.API{protocol.Legacy, protocol.JSON} {
			if !p.Has(api) {
				continue
			}
			base := p.LegacyEndpoint
			field := "endpoint"
			if api == protocol.JSON {
				base, field = p.JSONEndpoint, "api_endpoint"
			}
			if s, _ := pc[field].(string); s != "" {
				base = strings.TrimRight(repl.ReplaceAll(s, ""), "/")
			}
			t := endpointTiming{Provider: name, URL: base, Samples: samples}
			var times []time.Duration
			for range samples {
				start := time.Now()
				err := balanceCall(ctx, client, api, base, apiKey)
				if err != nil {
					t.Errors++
					t.Error = err.Error()
					continue
				}
				times = append(times, time.Since(start))
			}
			t.P50, t.P95 = pct(times, 50), pct(times, 95)
			fmt.Fprintf(progress, "drill: measured %s %s: p50 %.3fs p95 %.3fs (%d errors)\n", name, base, t.P50, t.P95, t.Errors)
			m.Endpoints = append(m.Endpoints, t)
		}
	}
	if address != "" {
		m.Delays = readDelays(ctx, client, address, def)
	}
	return m
}

// balanceCall makes one balance request (free at every provider).
func balanceCall(ctx context.Context, c *http.Client, api protocol.API, base, key string) error {
	var req *http.Request
	var err error
	if api == protocol.Legacy {
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, base+"/res.php?"+url.Values{"key": {key}, "action": {"getbalance"}, "json": {"1"}}.Encode(), nil)
	} else {
		body, _ := json.Marshal(map[string]string{"clientKey": key})
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, base+"/getBalance", strings.NewReader(string(body)))
		if req != nil {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("balance request answered %s", resp.Status)
	}
	return nil
}

// readDelays reads GET /pingback/tasks of a running instance (the
// operations API: {"tasks": [...], "next_cursor": ...}, each task with
// submitted_at and result_at) and summarises the pingback delays; the
// suggested after is clamped to def's `after auto` bounds.
func readDelays(ctx context.Context, c *http.Client, address string, def Defaults) *pingbackDelays {
	out := &pingbackDelays{Address: address}
	base := address
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	var delays []time.Duration
	cursor := ""
	for page := 0; page < 1000; page++ {
		u := base + "/pingback/tasks?state=done&limit=1000"
		if cursor != "" {
			u += "&cursor=" + url.QueryEscape(cursor)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			out.Error = err.Error()
			return out
		}
		resp, err := c.Do(req)
		if err != nil {
			out.Error = fmt.Sprintf("reading %s: %v", u, err)
			return out
		}
		var body struct {
			Tasks []struct {
				SubmittedAt time.Time `json:"submitted_at"`
				ResultAt    time.Time `json:"result_at"`
			} `json:"tasks"`
			NextCursor string `json:"next_cursor"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK || err != nil {
			out.Error = fmt.Sprintf("GET %s answered %s (the running instance needs the operations API's task list)", u, resp.Status)
			return out
		}
		for _, t := range body.Tasks {
			if !t.ResultAt.IsZero() && !t.SubmittedAt.IsZero() {
				delays = append(delays, t.ResultAt.Sub(t.SubmittedAt))
			}
		}
		if body.NextCursor == "" {
			break
		}
		cursor = body.NextCursor
	}
	out.Tasks = len(delays)
	if len(delays) == 0 {
		out.Error = "no tracked task with a result yet"
		return out
	}
	out.P50, out.P95 = pct(delays, 50), pct(delays, 95)
	out.Max = slices.Max(delays).Seconds()
	p95 := time.Duration(out.P95 * float64(time.Second))
	out.SuggestedAfter = min(max(p95*3/2, def.AutoAfterMin), def.AutoAfterMax).Round(time.Second).String()
	return out
}

// pct is the p-th percentile (nearest rank) in seconds; 0 for none.
func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p+99)/100 - 1
	return math.Round(s[max(i, 0)].Seconds()*1e6) / 1e6
}

func printMeasure(w io.Writer, m *drillMeasure) {
	fmt.Fprintln(w, "\nprovider endpoints (balance request):")
	for _, e := range m.Endpoints {
		line := fmt.Sprintf("  %-12s %-36s p50 %.3fs  p95 %.3fs  (%d samples, %d errors)", e.Provider, e.URL, e.P50, e.P95, e.Samples, e.Errors)
		if e.Error != "" {
			line += ": " + e.Error
		}
		fmt.Fprintln(w, line)
	}
	if d := m.Delays; d != nil {
		if d.Error != "" {
			fmt.Fprintf(w, "pingback delays from %s: %s\n", d.Address, d.Error)
			return
		}
		fmt.Fprintf(w, "pingback delays from %s (%d tasks): p50 %.1fs p95 %.1fs max %.1fs; suggested poll { after %s }\n",
			d.Address, d.Tasks, d.P50, d.P95, d.Max, d.SuggestedAfter)
	}
}
