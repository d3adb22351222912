//go:build !race

package testkit

// RaceEnabled says whether the test binary runs under the race detector
// (go test -race); CaddyBinary then builds the child Caddy with -race too.
const RaceEnabled = false
