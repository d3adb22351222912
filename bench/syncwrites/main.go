// Command syncwrites is Caddy with the standard modules, the pingback
// plugin and one store module more, pingback.stores.badger_syncwrites
// ([SyncWritesStore]): the Badger store opened without its journal, on
// Badger's own SyncWrites. It exists for bench/journal.sh, which measures
// the journal against the design before it; the journal is the default
// (and the faster), and no option of the plugin selects the other.
//
// The Caddyfile knows no such store: a config selects it in JSON, as
//
//	"store": {"module": "badger_syncwrites", "dir": "/var/tmp/pb-store"}
//
// (bench/journal.sh adapts its Caddyfile with `syncwrites adapt` and
// renames the store module of the result). Every other module and command
// is Caddy's cmd/caddy with the plugin.
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
