package pingback

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// The shared part of the `caddy pingback` subcommands that talk to the
// admin endpoint (cli_*.go): the flags every one takes, the request, and
// how errors are shown.
//
//	--address  the admin endpoint (as `caddy reload --address`); without
//	           it, the one the --config file names, else localhost:2019
//	--config, --adapter  the config file to read the admin address from
//	--json     print the admin API's JSON as it came; errors as
//	           {"error": "..."} on stderr
//
// Errors go to stderr and the command exits with status 1; an admin
// endpoint that cannot be reached is named in the error.

// adminFlags adds the shared flags to cmd.
func adminFlags(cmd *cobra.Command) {
	cmd.Flags().String("address", "", "Address of the administration endpoint (default: the config's, else localhost:2019)")
	cmd.Flags().StringP("config", "c", "", "Configuration file to read the admin address from")
	cmd.Flags().StringP("adapter", "a", "", "Name of the config adapter for --config")
	cmd.Flags().Bool("json", false, "Print the admin API's JSON")
	cmd.SilenceUsage = true
}

// cliClient is one invocation's connection to the admin endpoint.
type cliClient struct {
	cmd     *cobra.Command
	address string
	json    bool
}

func newCLIClient(cmd *cobra.Command) (*cliClient, error) {
	fs := cmd.Flags()
	address, _ := fs.GetString("address")
	config, _ := fs.GetString("config")
	adapter, _ := fs.GetString("adapter")
	asJSON, _ := fs.GetBool("json")
	c := &cliClient{cmd: cmd, json: asJSON}
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
func (c *cliClient) call(method, uri string, body any, out any) ([]byte, error) {
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
func (c *cliClient) printJSON(raw []byte) {
	w := c.cmd.OutOrStdout()
	_, _ = w.Write(bytes.TrimRight(raw, "\n"))
	_, _ = io.WriteString(w, "\n")
}

// cliRun wraps a subcommand's work: an error is printed to stderr (as
// {"error": ...} with --json) and fails the command.
func cliRun(work func(c *cliClient) error) func(cmd *cobra.Command, args []string) error {
	return func(cmd *cobra.Command, args []string) error {
		cmd.SilenceErrors = true // printed here, as text or JSON (flag and argument errors by cobra)
		c, err := newCLIClient(cmd)
		if err == nil {
			err = work(c)
		}
		if err == nil {
			return nil
		}
		w := cmd.ErrOrStderr()
		if c != nil && c.json {
			b, _ := json.Marshal(map[string]string{"error": err.Error()})
			fmt.Fprintf(w, "%s\n", b)
		} else {
			fmt.Fprintf(w, "Error: %v\n", err)
		}
		return err
	}
}

// ago formats the time since t, "-" for the zero time.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}

// flagTime reads the time flag --name: an RFC 3339 time, or a duration
// ago (2h); "" stays "". It returns the time in RFC 3339.
func flagTime(name, v string) (string, error) {
	if v == "" {
		return "", nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return time.Now().Add(-d).UTC().Format(time.RFC3339), nil
	}
	if _, err := time.Parse(time.RFC3339, v); err == nil {
		return v, nil
	}
	return "", fmt.Errorf("--%s must be an RFC 3339 time or a duration, got %q", name, v)
}
