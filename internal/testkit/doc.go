// Package testkit holds the test helpers that need no Caddy and nothing of
// the plugin's own packages: a stand-in for the application behind Caddy
// (App) and one that serves only so many requests at once and refuses
// the rest with a Retry-After (CappedApp), a client of a Caddy admin
// endpoint (Admin), a builder for the
// global options block of a test Caddyfile (Globals), a multipart body
// builder, waits on a condition (WaitFor, HoldsFor), a clock that moves
// only when told to (Clock), plain HTTP calls, a
// loopback port where nothing listens and a free port for a whole test
// process (ProcessPort), a buffer safe for a writer and readers, the build
// of ./cmd/caddy once per test binary, and what the race detector changes
// (RaceEnabled, Slowdown).
//
// It is a normal package that only tests import; it imports no package of
// this module, so any package's tests can use it. Helpers that need the
// plugin's unexported state (the in-process Caddy, the running app, the
// store) stay in the root package's tests (its startCaddy and friends).
//
// Every helper that can fail takes a testing.TB and fails the test, from
// the caller's line (t.Helper), rather than returning an error; only
// ProcessPort, for a package variable's initializer, returns one.
package testkit
