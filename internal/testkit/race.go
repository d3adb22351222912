//go:build race

package testkit

// RaceEnabled says whether the test binary runs under the race detector
// (go test -race); CaddyBinary then builds the child Caddy with -race too.
const RaceEnabled = true

// Slowdown is how many times longer the code under test may take than in
// a plain build: the race detector slows Go code down 2 to 20 times (10
// here, on top of a CPU shared with other test binaries). WaitFor stretches
// its timeout by it; a test whose budget is what it measures says how it
// uses it.
const Slowdown = 10
