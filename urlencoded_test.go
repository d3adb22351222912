package pingback

import (
	"net/url"
	"reflect"
	"testing"
)

// TestParseURLEncoded: the rules of parseURLEncoded, one case each. The
// "PHP/Node" notes say what PHP 8.2's parse_str and Node 20's
// URLSearchParams give for the same input where they differ from us.
func TestParseURLEncoded(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want url.Values
	}{
		{"empty", "", url.Values{}},
		{"two fields", "id=123&code=TOKEN", url.Values{"id": {"123"}, "code": {"TOKEN"}}},
		{"semicolon in a value", "id=1&code=x=1,y=2;x=3,y=4", url.Values{"id": {"1"}, "code": {"x=1,y=2;x=3,y=4"}}},
		{"semicolon does not split", "a=1;b=2", url.Values{"a": {"1;b=2"}}},
		{"semicolon alone", ";", url.Values{";": {""}}},
		{"semicolon in a name", "a;b=1", url.Values{"a;b": {"1"}}},
		{"plus is a space", "a=b+c&d+e=f", url.Values{"a": {"b c"}, "d e": {"f"}}},
		{"%2B is a plus", "a=%2B%2b", url.Values{"a": {"++"}}},
		{"%3B is a semicolon", "a=%3B%3b", url.Values{"a": {";;"}}},
		{"%20 is a space", "a=b%20c", url.Values{"a": {"b c"}}},
		{"escaped & and = are data", "a=%26b%3Dc", url.Values{"a": {"&b=c"}}},
		{"value holds more =", "a==b=c", url.Values{"a": {"=b=c"}}},
		{"malformed %zz kept", "a=%zz", url.Values{"a": {"%zz"}}},
		{"trailing % kept", "a=%", url.Values{"a": {"%"}}},
		{"% and one digit kept", "a=%4", url.Values{"a": {"%4"}}},
		{"% and one hex digit then a non-hex", "a=%4g", url.Values{"a": {"%4g"}}},
		{"%% then an escape", "a=%%41", url.Values{"a": {"%A"}}},
		{"malformed escape in a name", "%zz=1", url.Values{"%zz": {"1"}}},
		{"escape split by &", "a=%4&1=x", url.Values{"a": {"%4"}, "1": {"x"}}},
		{"%00 is a NUL byte", "a=%00b", url.Values{"a": {"\x00b"}}},
		// PHP: bytes as they are. Node: U+FFFD for each invalid byte.
		{"raw bytes ≥ 0x80 kept", "a=\xff\xfe\x80&\x81=\xc3\xa9", url.Values{"a": {"\xff\xfe\x80"}, "\x81": {"é"}}},
		{"escaped invalid UTF-8 kept", "a=%FF%fe%80", url.Values{"a": {"\xff\xfe\x80"}}},
		{"escaped UTF-8", "a=%C3%A9", url.Values{"a": {"é"}}},
		{"control bytes kept", "a=\x00\r\n\t", url.Values{"a": {"\x00\r\n\t"}}},
		{"name without =", "flag&a=1", url.Values{"flag": {""}, "a": {"1"}}},
		{"name with empty value", "a=", url.Values{"a": {""}}},
		// PHP drops an empty name; Node and WHATWG keep it.
		{"empty name", "=x", url.Values{"": {"x"}}},
		{"only =", "=", url.Values{"": {""}}},
		{"empty pairs skipped", "&&a=1&&&b=2&", url.Values{"a": {"1"}, "b": {"2"}}},
		{"only &", "&&&", url.Values{}},
		// PHP keeps the last; Node and WHATWG keep all, in order.
		{"repeated name keeps all values in order", "a=1&b=x&a=2&a=", url.Values{"a": {"1", "2", ""}, "b": {"x"}}},
		{"names are not rewritten", "a.b=1&c[]=2&d e=3", url.Values{"a.b": {"1"}, "c[]": {"2"}, "d e": {"3"}}},
		{"question mark and hash are data", "a=?b#c", url.Values{"a": {"?b#c"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseURLEncoded(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parseURLEncoded(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestParseURLEncodedAgreesWithParseQuery: where url.ParseQuery accepts an
// input, both read it the same way.
func TestParseURLEncodedAgreesWithParseQuery(t *testing.T) {
	for _, in := range []string{
		"", "a=1", "id=123&code=03AGdBq24PBC%2Bx_y", "a=b+c%20d", "a&b=&=c", "a=1&a=2&&b=%C3%A9",
		"x=%FF", "k=%2B%3D%26", "a==b",
	} {
		want, err := url.ParseQuery(in)
		if err != nil {
			t.Fatalf("url.ParseQuery(%q): %v", in, err)
		}
		if got := parseURLEncoded(in); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: parseURLEncoded %q, url.ParseQuery %q", in, got, want)
		}
	}
}
