package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// client is one invocation's connection to the admin endpoint.
type client struct {
	cmd     *cobra.Command
	address string
	json    bool
}

// newClient reads the shared flags of cmd; it returns the client (never
// nil, so that --json is known) with an error if the admin address cannot
// be determined.
func newClient(cmd *cobra.Command) (*client, error) {
	fs := cmd.Flags()
	address, _ := fs.GetString("address")
	config, _ := fs.GetString("config")
	adapter, _ := fs.GetString("adapter")
	asJSON, _ := fs.GetBool("json")
	c := &client{cmd: cmd, json: asJSON}
	addr, err := caddycmd.DetermineAdminAPIAddress(address, nil, config, adapter)
	if err != nil {
		return c, fmt.Errorf("finding the admin address: %w", err)
	}
	c.address = addr
	return c, nil
}

// errAPI is an error answer of the admin API.
type errAPI struct {
	status int
	msg    string
}

func (e *errAPI) Error() string { return fmt.Sprintf("%s (HTTP %d)", e.msg, e.status) }

// call sends method uri with body (JSON, or nil) and decodes a 2xx answer
// into out (unless nil); it returns the raw answer too.
func (c *client) call(method, uri string, body any, out any) ([]byte, error) {
	var rd io.Reader
	h := http.Header{}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
		h.Set("Content-Type", "application/json")
	}
	resp, err := adminRequestRaw(c.address, method, uri, h, rd)
	if err != nil {
		return nil, fmt.Errorf("admin endpoint %s: %w", c.address, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("admin endpoint %s: reading the answer: %w", c.address, err)
	}
	if resp.StatusCode >= 300 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Error == "" {
			e.Error = string(bytes.TrimSpace(raw))
		}
		return raw, &errAPI{status: resp.StatusCode, msg: e.Error}
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return raw, fmt.Errorf("admin endpoint %s: decoding the answer: %w", c.address, err)
		}
	}
	return raw, nil
}

// adminRequestRaw sends a request to the admin endpoint at addr (host:port
// or unix/path) the way caddycmd.AdminAPIRequest does (same Origin), but
// hands back every answer, error statuses included, for the caller to
// show.
func adminRequestRaw(addr, method, uri string, h http.Header, body io.Reader) (*http.Response, error) {
	parsed, err := caddy.ParseNetworkAddress(addr)
	if err != nil || parsed.PortRangeSize() > 1 {
		return nil, fmt.Errorf("invalid admin address %s: %v", addr, err)
	}
	origin := "http://" + parsed.JoinHostPort(0)
	transport := &http.Transport{DisableKeepAlives: true}
	if parsed.IsUnixNetwork() {
		origin = "http://127.0.0.1"
		path, _, _ := strings.Cut(parsed.Host, "|") // without the socket's file mode
		transport.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}
	}
	req, err := http.NewRequest(method, origin+uri, body)
	if err != nil {
		return nil, err
	}
	req.Header = h
	req.Header.Set("Origin", origin)
	return (&http.Client{Transport: transport, Timeout: time.Minute}).Do(req)
}

// printJSON writes the API's answer as it came.
func (c *client) printJSON(raw []byte) {
	w := c.cmd.OutOrStdout()
	_, _ = w.Write(bytes.TrimRight(raw, "\n"))
	_, _ = io.WriteString(w, "\n")
}

// printValue writes v as JSON, as printJSON writes an answer.
func (c *client) printValue(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	c.printJSON(raw)
	return nil
}

// table is a tab-aligned writer on stdout (two spaces between columns);
// flush it.
func (c *client) table() *tabwriter.Writer {
	return newTable(c.cmd.OutOrStdout())
}

// newTable is a tab-aligned writer on w (two spaces between columns);
// flush it.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}
