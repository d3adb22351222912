package testkit

import (
	"cmp"
	"fmt"
	"strings"
)

// Globals is the global options block of a test Caddyfile. Every test
// config skips installing a root into the trust store and does not persist
// the config; the fields give the rest. The global pingback block is always
// written, with the Pingback lines (empty lines give an empty block).
type Globals struct {
	Admin       string // admin listen address, host:port
	HTTPPort    string // http_port
	HTTPSPort   string // https_port; left out if empty
	GracePeriod string // grace_period (a Caddy duration); left out if empty
	AutoHTTPS   string // auto_https mode; "off" if empty
	Options     string // more global option lines (local_certs, storage ...), as written
	LogFile     string // if set, Caddy logs JSON to this file
	LogLevel    string // the level of that log; INFO if empty
	Pingback    string // the lines of the global pingback block
}

// Caddyfile returns the global block followed by sites (site blocks, as
// written).
func (g Globals) Caddyfile(sites string) string {
	var b strings.Builder
	b.WriteString("{\n")
	line := func(format string, args ...any) { fmt.Fprintf(&b, "\t"+format+"\n", args...) }
	line("admin %s", g.Admin)
	line("http_port %s", g.HTTPPort)
	if g.HTTPSPort != "" {
		line("https_port %s", g.HTTPSPort)
	}
	if g.GracePeriod != "" {
		line("grace_period %s", g.GracePeriod)
	}
	line("auto_https %s", cmp.Or(g.AutoHTTPS, "off"))
	if g.Options != "" {
		line("%s", g.Options)
	}
	line("skip_install_trust")
	line("persist_config off")
	if g.LogFile != "" {
		line("log {\n\t\toutput file %s\n\t\tformat json\n\t\tlevel %s\n\t}", g.LogFile, cmp.Or(g.LogLevel, "INFO"))
	}
	line("pingback {\n\t\t%s\n\t}", g.Pingback)
	b.WriteString("}\n")
	b.WriteString(sites)
	return b.String()
}
