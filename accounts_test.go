package pingback

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/store"
)

// TestAccountID: the account id is the first 8 bytes, in hex, of
// HMAC-SHA256 keyed with the key over "caddy-pingback account v1
// <provider>" (the issue's pinned definition); the vectors were computed
// with Python's hmac module, independently of this code.
func TestAccountID(t *testing.T) {
	for _, tc := range []struct{ provider, key, want string }{
		{"2captcha", "5157cafe5157cafe5157cafe5157cafe", "3cec5d40ae813669"},
		{"anticaptcha", "key-b", "735b405c4fd2fa08"},
	} {
		if got := accountID(tc.provider, tc.key); got != tc.want {
			t.Errorf("accountID(%q, %q) = %s, want %s", tc.provider, tc.key, got, tc.want)
		}
	}
	// One key, two providers: two accounts.
	if accountID("2captcha", "k") == accountID("rucaptcha", "k") {
		t.Error("the same key gives the same id at two providers")
	}
}

// TestAPIKeysJSON: api_key is a string for one key (written back as a
// string, so today's configs and golden files stay as they are) or an
// array for several.
func TestAPIKeysJSON(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    APIKeys
		out     string
		wantErr string
	}{
		{in: `"{env.KEY}"`, want: APIKeys{"{env.KEY}"}, out: `"{env.KEY}"`},
		{in: `["a","{env.B}"]`, want: APIKeys{"a", "{env.B}"}, out: `["a","{env.B}"]`},
		{in: `["only"]`, want: APIKeys{"only"}, out: `"only"`},
		{in: `""`, want: nil},
		{in: `5`, wantErr: "api_key must be a string or an array of strings"},
		{in: `["a",5]`, wantErr: "api_key must be a string or an array of strings"},
	} {
		var pc ProviderConfig
		err := json.Unmarshal([]byte(`{"api_key":`+tc.in+`}`), &pc)
		if tc.wantErr != "" {
			assertErrHas(t, err, tc.wantErr)
			continue
		}
		if err != nil || !slices.Equal(pc.APIKey, tc.want) {
			t.Errorf("%s: got %q, %v; want %q", tc.in, pc.APIKey, err, tc.want)
			continue
		}
		b, err := json.Marshal(pc)
		if err != nil {
			t.Fatal(err)
		}
		want := `{}`
		if tc.out != "" {
			want = `{"api_key":` + tc.out + `}`
		}
		if string(b) != want {
			t.Errorf("%s: marshalled %s, want %s", tc.in, b, want)
		}
	}
}

// TestAPIKeyCaddyfile: `api_key <key> [<key>...]` on one line; repeating
// the line stays an error.
func TestAPIKeyCaddyfile(t *testing.T) {
	parse := func(input string) (*ProviderConfig, error) {
		v, err := parseGlobalOption(caddyfile.NewTestDispenser(input), nil)
		if err != nil {
			return nil, err
		}
		var app App
		if err := json.Unmarshal(v.(httpcaddyfile.App).Value, &app); err != nil {
			return nil, err
		}
		return app.Providers["2captcha"], nil
	}
	pc, err := parse("pingback {\n\tprovider 2captcha {\n\t\tapi_key {env.A} {env.B} literal\n\t}\n}")
	if err != nil {
		t.Fatal(err)
	}
	if want := (APIKeys{"{env.A}", "{env.B}", "literal"}); !slices.Equal(pc.APIKey, want) {
		t.Errorf("api_key = %q, want %q", pc.APIKey, want)
	}
	_, err = parse("pingback {\n\tprovider 2captcha {\n\t\tapi_key a\n\t\tapi_key b\n\t}\n}")
	assertErrHas(t, err, "api_key specified more than once", "Testfile:4")
	_, err = parse("pingback {\n\tprovider 2captcha {\n\t\tapi_key\n\t}\n}")
	assertErrHas(t, err, "wrong argument count", "Testfile:3")
}

// TestProvisionAccounts: each entry is one account; duplicates are errors
// naming their positions; one {env.VAR} is one key, never split; an entry
// that resolves empty fails the start, not the provision.
func TestProvisionAccounts(t *testing.T) {
	t.Setenv("PINGBACK_TEST_KEY_A", "aaaa aaaa") // a space: still one key
	t.Setenv("PINGBACK_TEST_KEY_B", "bbbbbbbb")
	t.Setenv("PINGBACK_TEST_KEY_DUP", "bbbbbbbb")
	_ = os.Unsetenv("PINGBACK_TEST_KEY_UNSET")
	for _, tc := range []struct {
		name      string
		keys      APIKeys
		wantIDs   []string
		wantShown []string
		wantErr   string
		wantStart string
	}{
		{name: "one placeholder", keys: APIKeys{"{env.PINGBACK_TEST_KEY_A}"},
			wantIDs: []string{accountID("2captcha", "aaaa aaaa")}, wantShown: []string{"{env.PINGBACK_TEST_KEY_A}"}},
		{name: "placeholder and literal", keys: APIKeys{"{env.PINGBACK_TEST_KEY_B}", "literal-key"},
			wantIDs:   []string{accountID("2captcha", "bbbbbbbb"), accountID("2captcha", "literal-key")},
			wantShown: []string{"{env.PINGBACK_TEST_KEY_B}", "api_key #2"}},
		{name: "braces in a literal key", keys: APIKeys{"ab{cd", "x{env.PINGBACK_TEST_KEY_B}", "{unknown.placeholder}tail"},
			wantIDs:   []string{accountID("2captcha", "ab{cd"), accountID("2captcha", "xbbbbbbbb"), accountID("2captcha", "tail")},
			wantShown: []string{"api_key #1", "api_key #2", "api_key #3"}},
		{name: "same key twice", keys: APIKeys{"x", "{env.PINGBACK_TEST_KEY_B}", "{env.PINGBACK_TEST_KEY_DUP}"},
			wantErr: "provider 2captcha: api_key entries 2 and 3 are the same key"},
		{name: "unset variable", keys: APIKeys{"x", "{env.PINGBACK_TEST_KEY_UNSET}"},
			wantIDs: []string{accountID("2captcha", "x")}, wantShown: []string{"api_key #1"},
			wantStart: `api_key "{env.PINGBACK_TEST_KEY_UNSET}" (entry 2) resolves to an empty key`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pc := &ProviderConfig{APIKey: tc.keys}
			err := pc.provision("2captcha", time.Hour)
			if tc.wantErr != "" {
				assertErrHas(t, err, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids, shown []string
			for _, acc := range pc.accounts {
				ids, shown = append(ids, acc.id), append(shown, acc.configured)
			}
			if !slices.Equal(ids, tc.wantIDs) || !slices.Equal(shown, tc.wantShown) {
				t.Errorf("accounts %q shown as %q, want %q as %q", ids, shown, tc.wantIDs, tc.wantShown)
			}
			a := &App{Providers: map[string]*ProviderConfig{"2captcha": pc}}
			err = a.checkProviderKeys()
			if tc.wantStart == "" && err != nil {
				t.Errorf("start: %v", err)
			}
			if tc.wantStart != "" {
				assertErrHas(t, err, tc.wantStart)
			}
		})
	}
}

// TestRegistrationAccount: POST /pingback/tasks takes an account, which
// must be a configured one, and needs it when the provider has several.
func TestRegistrationAccount(t *testing.T) {
	one := &ProviderConfig{APIKey: APIKeys{"k1"}}
	two := &ProviderConfig{APIKey: APIKeys{"k1", "k2"}}
	for _, pc := range []*ProviderConfig{one, two} {
		if err := pc.provision("2captcha", time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	id1, id2 := accountID("2captcha", "k1"), accountID("2captcha", "k2")
	for _, tc := range []struct {
		name    string
		pc      *ProviderConfig
		account string
		want    string
		wantErr string
	}{
		{name: "one key, none named", pc: one, want: id1},
		{name: "one key, named", pc: one, account: id1, want: id1},
		{name: "two keys, named", pc: two, account: id2, want: id2},
		{name: "two keys, none named", pc: two, wantErr: "account is required: provider 2captcha has 2 api_key accounts"},
		{name: "unknown account", pc: two, account: "00000000000000ff", wantErr: `account "00000000000000ff" is not one of provider 2captcha's configured api_key accounts`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := registrationAccount(tc.pc, adminapi.TaskRegistration{Provider: "2captcha", Account: tc.account})
			if tc.wantErr != "" {
				assertErrHas(t, err, tc.wantErr)
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestAccountStatuses: every configured account is shown with its key
// entry; an account with pending tasks but no configured key is shown
// with them all unpollable; budgets are each account's, summed per
// provider.
func TestAccountStatuses(t *testing.T) {
	pc := &ProviderConfig{APIKey: APIKeys{"{env.PINGBACK_TEST_ACC_A}", "literal-b"}}
	t.Setenv("PINGBACK_TEST_ACC_A", "key-a")
	if err := pc.provision("2captcha", time.Hour); err != nil {
		t.Fatal(err)
	}
	a := &App{Providers: map[string]*ProviderConfig{"2captcha": pc}, Poll: &PollConfig{Rate: 5, GiveUp: caddy.Duration(time.Hour)}}
	idA, idB, unknown := accountID("2captcha", "key-a"), accountID("2captcha", "literal-b"), accountID("2captcha", "gone")
	c := store.Counts{TasksPendingByAccount: map[string]map[string]int64{"2captcha": {idA: 3, unknown: 2}}}
	budget := map[store.Account]adminapi.BudgetStatus{
		{Provider: "2captcha", ID: idA}: {Used: 7, Left: 623},
		{Provider: "2captcha", ID: idB}: {Used: 1, Left: 599},
	}
	got := a.accountStatuses(c, budget)
	want := map[string]adminapi.AccountStatus{
		idA:     {APIKeyEntry: "{env.PINGBACK_TEST_ACC_A}", Used: 7, Left: 623, Pending: 3},
		idB:     {APIKeyEntry: "api_key #2", Used: 1, Left: 599},
		unknown: {Pending: 2, Unpollable: 2},
	}
	if len(got) != 1 || len(got["2captcha"]) != len(want) {
		t.Fatalf("accounts = %+v, want 2captcha: %+v", got, want)
	}
	for id, w := range want {
		if g := got["2captcha"][id]; g != w {
			t.Errorf("account %s = %+v, want %+v", id, g, w)
		}
	}
	if n := unpollableOf(got["2captcha"]); n != 2 {
		t.Errorf("unpollable = %d, want 2", n)
	}
	if b := providerBudgets(budget)["2captcha"]; b != (adminapi.BudgetStatus{Used: 8, Left: 1222}) {
		t.Errorf("provider budget = %+v, want the sum", b)
	}
	for _, s := range got["2captcha"] {
		if strings.Contains(s.APIKeyEntry, "key-a") || strings.Contains(s.APIKeyEntry, "literal-b") {
			t.Errorf("status shows a key: %q", s.APIKeyEntry)
		}
	}
}

// TestLegacyAccounts: tasks stored before accounts belong to the account
// of each provider's first configured key.
func TestLegacyAccounts(t *testing.T) {
	a := &App{Providers: map[string]*ProviderConfig{
		"2captcha":  {APIKey: APIKeys{"first", "second"}},
		"capsolver": {},
	}}
	for name, pc := range a.Providers {
		if err := pc.provision(name, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	got := a.legacyAccounts()
	if len(got) != 1 || got["2captcha"] != accountID("2captcha", "first") {
		t.Errorf("legacy accounts = %v, want only 2captcha's first key", got)
	}
}

// FuzzAPIKeysJSON: any JSON value is either refused or read as keys that
// marshal back to a value read as the same keys.
func FuzzAPIKeysJSON(f *testing.F) {
	for _, s := range []string{`"k"`, `["a","b"]`, `[]`, `""`, `null`, `5`, `["a",null]`, `{"a":1}`, `"\u00e9"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var k APIKeys
		if err := k.UnmarshalJSON([]byte(in)); err != nil {
			return
		}
		b, err := k.MarshalJSON()
		if err != nil {
			t.Fatalf("%q read as %q, which does not marshal: %v", in, k, err)
		}
		var again APIKeys
		if err := again.UnmarshalJSON(b); err != nil || !slices.Equal(k, again) {
			if !(len(k) == 0 && len(again) == 0) {
				t.Fatalf("%q read as %q, marshalled %s, read back as %q (%v)", in, k, b, again, err)
			}
		}
	})
}

// TestWarnUnpollableOncePerAccountAndHour: the unpollable warning is
// logged once per account id and hour, whatever the number of tasks, and
// an account's entry older than the hour is dropped when another is
// logged.
func TestWarnUnpollableOncePerAccountAndHour(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	a := &App{logger: zap.New(core), handle: &storeHandle{}, now: func() time.Time { return now }}
	one, two := store.Account{Provider: "2captcha", ID: "00000000000000a1"}, store.Account{Provider: "2captcha", ID: "00000000000000b2"}
	const msg = "tasks submitted with an API key this Caddy does not know: their results can only arrive by pingback; add the key to the provider's api_key"
	count := func(acct store.Account) int {
		n := 0
		for _, e := range logs.FilterMessage(msg).All() {
			if e.ContextMap()["account"] == acct.ID {
				n++
			}
		}
		return n
	}
	three := store.Account{Provider: "rucaptcha", ID: "00000000000000c3"}
	for _, step := range []struct {
		after    time.Duration
		acct     store.Account
		wantOne  int
		wantTwo  int
		wantSeen int
	}{
		{0, one, 1, 0, 1},
		{time.Minute, one, 1, 0, 1},      // within the hour: not again
		{time.Minute, two, 1, 1, 2},      // another account: its own line
		{59 * time.Minute, one, 2, 1, 2}, // an hour after one's line: again
		{30 * time.Minute, two, 2, 2, 2}, // two's hour is over too
		{10 * time.Minute, one, 2, 2, 2}, // within one's hour
		{2 * time.Hour, three, 2, 2, 1},  // one's and two's entries, over the hour, are dropped
	} {
		now = now.Add(step.after)
		a.warnUnpollable(step.acct, 1)
		if g1, g2 := count(one), count(two); g1 != step.wantOne || g2 != step.wantTwo {
			t.Fatalf("at %s: %d lines for one, %d for two; want %d, %d", now.Format(time.Kitchen), g1, g2, step.wantOne, step.wantTwo)
		}
		if n := len(a.handle.unpollableLogged); n != step.wantSeen {
			t.Errorf("at %s: %d accounts remembered, want %d", now.Format(time.Kitchen), n, step.wantSeen)
		}
	}
}
