package pingback

import (
	"fmt"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// provider is what the plugin knows of one solving service; the facts and
// their sources live in internal/protocol and docs/protocols.md.
type provider = protocol.Provider

// providerNames lists the known providers, sorted, for messages.
func providerNames() string { return protocol.NameList() }

// lookupProvider returns the named provider or an error naming the known ones.
func lookupProvider(name string) (provider, error) {
	p, ok := protocol.Lookup(name)
	if !ok {
		return provider{}, fmt.Errorf("unknown provider %q (known: %s)", name, providerNames())
	}
	return p, nil
}
