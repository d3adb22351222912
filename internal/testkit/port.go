package testkit

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// UnusedLoopbackPort returns a loopback port (a decimal string) where
// nothing listens: it listens on an ephemeral port of 127.0.0.1 and closes
// the listener at once, so a connection to it is refused (an app or a
// provider that is down) until a test listens there again (NewAppOn).
func UnusedLoopbackPort(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// ProcessPort returns a port (a decimal string) that is free on every
// interface and lies below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range; 32768 if unreadable), for a
// port a test process takes once and binds again and again, such as the
// in-process Caddy's, which every test loads and unloads. A port from
// listening on :0 is ephemeral: while the test process has it closed, the
// kernel may hand it to another test process's listener or to an outgoing
// connection; below the range only another process choosing the same
// random port can take it. It tries random ports from 10000 up and fails
// after 100 taken ones.
func ProcessPort() (string, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				low = n
			}
		}
	}
	for range 100 {
		port := strconv.Itoa(10000 + rand.IntN(low-10000))
		ln, err := net.Listen("tcp", ":"+port)
		if err != nil {
			continue
		}
		if err := ln.Close(); err != nil {
			return "", err
		}
		return port, nil
	}
	return "", errors.New("no free port below the ephemeral range after 100 tries")
}
