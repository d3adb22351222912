package pingback

import (
	"fmt"
	"slices"
	"strings"
)

// provider describes what the plugin knows of one solving service.
type provider struct {
	// validID reports whether id is a well-formed task id.
	validID func(id string) bool
	// idRule says in words what validID checks, for error messages.
	idRule string
}

// providers are the services whose pingbacks the handler accepts.
//
// Task ids: 2captcha's res.php rejects non-numeric ids with
// ERROR_WRONG_ID_FORMAT ("id must be numeric"), and rucaptcha and CaptchaAI
// speak the same protocol (provider-protocol.md §1.1, §1.6). CaptchaAI may
// send the id as a JSON number (§1.3); it is still digits. 32 digits is our
// own generous bound, not a documented limit.
var providers = map[string]provider{
	"captchaai": digitsProvider,
	"2captcha":  digitsProvider,
	"rucaptcha": digitsProvider,
}

var digitsProvider = provider{
	validID: func(id string) bool {
		if len(id) < 1 || len(id) > 32 {
			return false
		}
		for i := 0; i < len(id); i++ {
			if id[i] < '0' || id[i] > '9' {
				return false
			}
		}
		return true
	},
	idRule: "1 to 32 digits",
}

// providerNames lists the known providers, sorted, for messages.
func providerNames() string {
	names := make([]string, 0, len(providers))
	for n := range providers {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// lookupProvider returns the named provider or an error naming the known ones.
func lookupProvider(name string) (provider, error) {
	p, ok := providers[name]
	if !ok {
		return provider{}, fmt.Errorf("unknown provider %q (known: %s)", name, providerNames())
	}
	return p, nil
}
