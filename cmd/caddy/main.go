// Command caddy is Caddy with the standard modules and the pingback plugin,
// so that `go run ./cmd/caddy run --config Caddyfile.example` works without
// xcaddy. It is the same main as Caddy's own cmd/caddy.
package main

import (
	_ "time/tzdata"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/caddy-pingback/pingback"
)

func main() {
	caddycmd.Main()
}
