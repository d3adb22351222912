package testkit

import (
	"net"
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
