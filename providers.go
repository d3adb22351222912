package pingback

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
)

// provider describes what the plugin knows of one solving service.
type provider struct {
	// validID reports whether id is a well-formed task id.
	validID func(id string) bool
	// idRule says in words what validID checks, for error messages.
	idRule string
	// endpoint is the default base URL of in.php and res.php.
	endpoint string
	// callbackMethod is how the provider calls a pingback URL: "GET"
	// (query id, code) or "POST" (form id, code).
	callbackMethod string
}

// providers are the services whose pingbacks the handler accepts.
//
// Task ids: 2captcha's res.php rejects non-numeric ids with
// ERROR_WRONG_ID_FORMAT ("id must be numeric"), and rucaptcha and CaptchaAI
// speak the same protocol (provider-protocol.md §1.1, §1.6). CaptchaAI may
// send the id as a JSON number (§1.3); it is still digits. 32 digits is our
// own generous bound, not a documented limit.
//
// Endpoints: provider-protocol.md §1.1. Pingback methods: 2captcha and
// rucaptcha POST a form (§2.1); CaptchaAI's blog says GET with a query
// (§2.2; not confirmed by its official docs, hence overridable with
// callback_method).
var providers = map[string]provider{
	"captchaai": digitsProvider.with("https://ocr.captchaai.com", http.MethodGet),
	"2captcha":  digitsProvider.with("https://2captcha.com", http.MethodPost),
	"rucaptcha": digitsProvider.with("https://rucaptcha.com", http.MethodPost),
}

func (p provider) with(endpoint, callbackMethod string) provider {
	p.endpoint, p.callbackMethod = endpoint, callbackMethod
	return p
}

// tokenMethods are in.php methods whose answers never contain "|", so their
// results can be fetched in bulk with res.php?ids= and split on "|"
// (provider-protocol.md §1.4, §1.5: FunCaptcha and KeyCaptcha answers do
// contain "|", coordinates and rotate answers too).
var tokenMethods = map[string]bool{
	"userrecaptcha": true,
	"hcaptcha":      true,
	"turnstile":     true,
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
