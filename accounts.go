package pingback

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-pingback/pingback/internal/store"
)

// APIKeys is a provider's api_key: one key or several, each an account of
// the provider the plugin may poll for. In JSON a single key is a string
// ("api_key": "{env.KEY}", as before accounts) and several are an array
// ("api_key": ["{env.KEY_A}", "{env.KEY_B}"]); a single key is written
// back as a string, so configs and their adapted JSON stay as they were.
// Order has no meaning, except that tasks stored before tasks had accounts
// belong to the first key's account (docs/configuration.md, "Several API
// keys").
type APIKeys []string

// UnmarshalJSON accepts a string (one key; "" is none) or an array of
// strings.
func (k *APIKeys) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*k = nil
		if one != "" {
			*k = APIKeys{one}
		}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("api_key must be a string or an array of strings")
	}
	*k = many
	return nil
}

// MarshalJSON writes one key as a string and several as an array.
func (k APIKeys) MarshalJSON() ([]byte, error) {
	if len(k) == 1 && k[0] != "" {
		return json.Marshal(k[0])
	}
	return json.Marshal([]string(k))
}

// account is one configured API key of a provider, resolved.
type account struct {
	// id is the account id: accountID of the key.
	id string
	// key is the resolved key; never logged, shown or stored.
	key string
	// configured says which api_key entry it is without giving the key:
	// the entry itself if it is one placeholder and nothing else
	// ("{env.KEY_B}"), else its position ("api_key #2"): a key written
	// in the config, even with braces or a placeholder in it, is never
	// shown.
	configured string
}

// accountMessage is the message the account id's HMAC is computed over,
// followed by the provider's name.
const accountMessage = "caddy-pingback account v1 "

// accountID is the account id of an API key of provider: the first 8
// bytes, in hex (16 characters), of HMAC-SHA256 keyed with the key over
// "caddy-pingback account v1 <provider>". The same on every restart and
// instance; it names the account without giving the key back (provider
// keys are long random strings, so guesses cannot be tested against it).
func accountID(provider, key string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(accountMessage + provider))
	return hex.EncodeToString(m.Sum(nil)[:8])
}

// provisionAccounts resolves the api_key entries of provider name: each
// entry's placeholders, its account id, and what to call it in logs.
// Two entries that resolve to the same key, or whose ids collide, are an
// error naming their positions (1-based). An entry that resolves empty
// (an unset {env.VAR}) is kept as keyErr, which fails the app's start but
// not `caddy validate`.
func (pc *ProviderConfig) provisionAccounts(name string, repl *caddy.Replacer) error {
	pc.accounts, pc.keyErr = nil, nil
	seenKey := map[string]int{}
	seenID := map[string]int{}
	for i, given := range pc.APIKey {
		pos := i + 1
		key := repl.ReplaceAll(given, "")
		if key == "" {
			if pc.keyErr == nil {
				pc.keyErr = fmt.Errorf("provider %s: api_key %q (entry %d) resolves to an empty key (is the environment variable set?)", name, given, pos)
			}
			continue
		}
		if j, dup := seenKey[key]; dup {
			return fmt.Errorf("provider %s: api_key entries %d and %d are the same key", name, j, pos)
		}
		seenKey[key] = pos
		id := accountID(name, key)
		if j, dup := seenID[id]; dup {
			return fmt.Errorf("provider %s: api_key entries %d and %d have the same account id %s", name, j, pos, id)
		}
		seenID[id] = pos
		configured := "api_key #" + strconv.Itoa(pos)
		if onePlaceholder(given) {
			configured = given
		}
		pc.accounts = append(pc.accounts, account{id: id, key: key, configured: configured})
	}
	return nil
}

// account returns the configured account with the given id.
func (pc *ProviderConfig) account(id string) (account, bool) {
	for _, acc := range pc.accounts {
		if acc.id == id {
			return acc, true
		}
	}
	return account{}, false
}

// taskAccount returns the configured account that tasks of the account
// id are polled, confirmed and answered locally with: the account of that
// id; for tasks stored without account (before accounts, while their
// provider had no key, so the store's upgrade could not stamp them), the
// first configured key's, as the upgrade would have stamped them.
func (pc *ProviderConfig) taskAccount(id string) (account, bool) {
	if id == "" {
		if len(pc.accounts) == 0 {
			return account{}, false
		}
		return pc.accounts[0], true
	}
	return pc.account(id)
}

// hasKey reports whether key is one of the provider's configured keys.
func (pc *ProviderConfig) hasKey(key string) bool {
	if key == "" {
		return false
	}
	for _, acc := range pc.accounts {
		if hmac.Equal([]byte(acc.key), []byte(key)) {
			return true
		}
	}
	return false
}

// onlyAccount returns the provider's account when it has exactly one.
func (pc *ProviderConfig) onlyAccount() (account, bool) {
	if len(pc.accounts) != 1 {
		return account{}, false
	}
	return pc.accounts[0], true
}

// keys returns the configured keys, for scrubbing them from text.
func (pc *ProviderConfig) keys() []string {
	out := make([]string, len(pc.accounts))
	for i, acc := range pc.accounts {
		out[i] = acc.key
	}
	return out
}

// taskPollable reports whether t's account is one of its provider's
// configured keys (taskAccount): only then may it be polled or confirmed.
func (a *App) taskPollable(t *store.Task) bool {
	_, ok := a.providerConfig(t.Provider).taskAccount(t.Account)
	return ok
}

// legacyAccounts returns, per provider with a key, the account of its
// first configured key: the account of the tasks stored before tasks had
// accounts, which the store's upgrade stamps on them at the first open.
func (a *App) legacyAccounts() map[string]string {
	out := map[string]string{}
	for name, pc := range a.Providers {
		if pc != nil && len(pc.accounts) > 0 {
			out[name] = pc.accounts[0].id
		}
	}
	return out
}

// onePlaceholder reports whether s is exactly one placeholder, "{name}"
// with no brace inside: an entry that may be shown, since it holds no
// part of a key.
func onePlaceholder(s string) bool {
	return len(s) > 2 && s[0] == '{' && s[len(s)-1] == '}' && !strings.ContainsAny(s[1:len(s)-1], "{}")
}
