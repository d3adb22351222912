//go:build !race

package testkit

// RaceEnabled says whether the test binary runs under the race detector
// (go test -race); CaddyBinary then builds the child Caddy with -race too.
const RaceEnabled = false

// Slowdown is how many times longer the code under test may take than in
// a plain build: 1 without the race detector. WaitFor stretches its
// timeout by it; a test whose budget is what it measures says how it uses
// it.
const Slowdown = 1
