package pingback

import (
	"net/url"
	"strings"
)

// parseURLEncoded parses an application/x-www-form-urlencoded body or a URL
// query string (the part after '?', as in url.URL.RawQuery) into its
// fields. It never fails: every input has one reading, the one PHP and Node
// give it, so a pingback that those accept is not lost here.
//
// Shape: pairs separated by '&', each "name=value" or a bare "name":
//
//	id=123&code=x=1,y=2;x=3,y=4&flag
//	→ id: ["123"], code: ["x=1,y=2;x=3,y=4"], flag: [""]
//
// The rules, as the WHATWG URL Standard's application/x-www-form-urlencoded
// parser (https://url.spec.whatwg.org/#urlencoded-parsing) has them, which is
// what Node's URLSearchParams implements:
//
//   - Only '&' separates pairs; ';' is data. PHP splits POST bodies on '&'
//     and query strings on arg_separator.input, '&' by default
//     (https://www.php.net/manual/en/ini.core.php#ini.arg-separator.input);
//     Node's querystring.parse defaults to sep '&'
//     (https://nodejs.org/api/querystring.html#querystringparsestr-sep-eq-options).
//     Go's url.ParseQuery refuses a pair holding ';' since Go 1.17
//     (https://go.dev/issue/25192), which is why this parser exists.
//   - Empty pairs ("a=1&&b=2", a leading or trailing '&') are skipped.
//   - A pair splits at its first '='; the value may hold more '='. A pair
//     without '=' is a name with the empty value.
//   - In names and values '+' is a space and %XX (two hex digits, either
//     case) is that byte. Any other '%' ("%zz", "%4", a trailing '%') stays
//     as it is, as in the WHATWG percent-decode, PHP's urldecode
//     (https://www.php.net/manual/en/function.urldecode.php) and Node's
//     querystring.unescape.
//   - Bytes are kept as they are: a name or value that is not valid UTF-8
//     (raw bytes ≥ 0x80, or escapes of them) is not replaced, as in PHP,
//     where strings are bytes. URLSearchParams and querystring would turn
//     it into U+FFFD; that would change the code the app receives.
//   - An empty name ("=x") is kept as the name "", as WHATWG and Node keep
//     it (PHP drops it); nothing the pingback reads has that name.
//   - A repeated name keeps every value, in order, as WHATWG and Node do
//     (PHP keeps the last); readCallback refuses a repeated id or code.
//
// PHP's own rewriting of names (spaces and dots to '_', "a[]" to arrays)
// is not followed: names are taken literally.
func parseURLEncoded(s string) url.Values {
	fields := make(url.Values)
	for s != "" {
		var pair string
		pair, s, _ = strings.Cut(s, "&")
		if pair == "" {
			continue
		}
		name, value, _ := strings.Cut(pair, "=")
		name = unescapeURLEncoded(name)
		fields[name] = append(fields[name], unescapeURLEncoded(value))
	}
	return fields
}

// unescapeURLEncoded decodes one name or value of a form body or query:
// '+' is a space, %XX with two hex digits is that byte, every other byte
// (a '%' that starts no such escape included) is kept. "a+b%2B%3B%zz%"
// gives "a b+;%zz%".
func unescapeURLEncoded(s string) string {
	if !strings.ContainsAny(s, "+%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b = append(b, ' ')
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			b = append(b, c)
		}
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// unhex is the value of the hex digit c (isHex(c) holds).
func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	default:
		return c - 'A' + 10
	}
}
