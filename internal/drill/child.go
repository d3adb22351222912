package drill

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/caddy-pingback/pingback/internal/store"
)

// drillChild is the child Caddy running the sandbox config: the same
// binary as the drill, `caddy run` on the rewritten JSON, with its own
// home, data and config directories under the sandbox's temporary one.
type drillChild struct {
	sb   *sandbox
	exe  string // the caddy binary; "" is this process's own (the drill runs in caddy)
	cmd  *exec.Cmd
	done chan struct{}
	runs int
}

// start writes the config and starts the child, then waits until its
// admin endpoint answers and the pingback app has started.
func (c *drillChild) start(ctx context.Context) error {
	exe := c.exe
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return err
		}
	}
	cfgPath := filepath.Join(c.sb.Dir, "drill.json")
	body, err := json.MarshalIndent(c.sb.JSON, "", "\t")
	if err != nil {
		return err
	}
	if err := os.WriteFile(cfgPath, body, 0o600); err != nil {
		return err
	}
	c.runs++
	logf, err := os.Create(filepath.Join(c.sb.Dir, fmt.Sprintf("caddy-%d.log", c.runs)))
	if err != nil {
		return err
	}
	home := filepath.Join(c.sb.Dir, "home")
	for _, d := range []string{home, filepath.Join(home, "data"), filepath.Join(home, "config")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	cmd := exec.Command(exe, "run", "--config", cfgPath)
	cmd.Env = append(drillChildEnv(os.Environ()),
		"HOME="+home, "XDG_DATA_HOME="+filepath.Join(home, "data"), "XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_CACHE_HOME="+filepath.Join(home, "cache"), "APPDATA="+filepath.Join(home, "data"))
	if c.sb.Scale < 1 {
		cmd.Env = append(cmd.Env, ScaleEnv+"="+strconv.FormatFloat(c.sb.Scale, 'g', -1, 64))
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a SIGINT at the terminal reaches the drill,
	// which ends the child itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return err
	}
	c.cmd = cmd
	c.done = make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(c.done) }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-c.done:
			return fmt.Errorf("the sandbox Caddy exited at start: %s", c.logTail())
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if c.ready() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the sandbox Caddy did not start within 30s: %s", c.logTail())
		}
		time.Sleep(50 * time.Millisecond) // polling a child's start-up: no event to wait on
	}
}

// drillChildEnv drops variables that would point the child at the user's
// Caddy directories.
func drillChildEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "APPDATA", ScaleEnv:
			continue
		}
		out = append(out, kv)
	}
	return out
}

// ready reports whether the child's pingback app answers on the admin API.
func (c *drillChild) ready() bool {
	resp, err := http.Get("http://" + c.sb.AdminAddr + "/pingback/records?limit=1")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// kill ends the child with SIGKILL and waits for it.
func (c *drillChild) kill() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Kill()
	<-c.done
	c.cmd = nil
}

// stop ends the child gracefully (SIGINT), then SIGKILL after 5s.
func (c *drillChild) stop() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Signal(os.Interrupt)
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	c.cmd = nil
}

// logTail is the end of the child's current log, for error messages.
func (c *drillChild) logTail() string {
	b, err := os.ReadFile(filepath.Join(c.sb.Dir, fmt.Sprintf("caddy-%d.log", c.runs)))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, "\n")
}

// stored reports whether the child's store holds the result key (the
// admin API's GET of one record: 200 or 404).
func (c *drillChild) stored(provider, id string) (bool, error) {
	rec, err := c.record(provider, id)
	return rec != nil, err
}

// record is the child's stored result of key (the admin API's GET of one
// record), nil if none is stored.
func (c *drillChild) record(provider, id string) (*store.Record, error) {
	resp, err := http.Get("http://" + c.sb.AdminAddr + "/pingback/records/" + url.PathEscape(provider) + "/" + url.PathEscape(id))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		var rec store.Record
		if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
			return nil, fmt.Errorf("admin API's record: %v", err)
		}
		return &rec, nil
	case http.StatusNotFound:
		return nil, nil
	}
	return nil, fmt.Errorf("admin API answered %s", resp.Status)
}

// registerTask tells the child's poller of a task, as pingback_track does
// for the app's submissions (POST /pingback/tasks).
func (c *drillChild) registerTask(provider, id, pingbackURL, api, method string) error {
	body, _ := json.Marshal(map[string]string{"provider": provider, "id": id, "pingback_url": pingbackURL, "api": api,
		"method": method})
	resp, err := http.Post("http://"+c.sb.AdminAddr+"/pingback/tasks", "application/json", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return errors.New("registering the task: " + resp.Status)
	}
	return nil
}
