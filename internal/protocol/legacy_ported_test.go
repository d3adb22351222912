package protocol

import (
	"strings"
	"testing"
	"time"
)

// The tables below came with the plugin's first parsers; their answers are
// the documented shapes of https://2captcha.com/2captcha-api (in.php and
// res.php answers, res.php errors, "Request limits").

func parseResultAnswer(b []byte) (string, bool) {
	a, ok := SeenResAnswer(b)
	if !ok || a.Kind != Result {
		return "", false
	}
	return a.Code, true
}

func parseTaskError(b []byte) (string, bool) {
	a, ok := SeenResAnswer(b)
	return a.Code, ok && a.Kind == TaskError
}

func TestClassifyText(t *testing.T) {
	tests := []struct {
		text string
		kind Kind
		wait time.Duration
	}{
		// Not ready: both spellings (the provider's own is CAPCHA_).
		{text: "CAPCHA_NOT_READY", kind: NotReady},
		{text: "CAPTCHA_NOT_READY", kind: NotReady},
		// Results: tokens, short texts, tokens with "|".
		{text: "03AGdBq24PBCbwiDRaS_MJ7Z", kind: Result},
		{text: "W9H5K", kind: Result},
		{text: "1d9c8e.2|r=eu-west-1|meta=3", kind: Result},
		// Task-final errors reach the app as its result.
		{text: "ERROR_CAPTCHA_UNSOLVABLE", kind: TaskError},
		{text: "ERROR_BAD_DUPLICATES", kind: TaskError},
		// The provider does not know the task (any more): it expires.
		{text: "ERROR_WRONG_CAPTCHA_ID", kind: UnknownTask},
		{text: "ERROR_WRONG_ID_FORMAT", kind: UnknownTask},
		// Key errors stop polling the provider.
		{text: "ERROR_WRONG_USER_KEY", kind: KeyError},
		{text: "ERROR_KEY_DOES_NOT_EXIST", kind: KeyError},
		// Account and rate conditions back off, at least as long as documented.
		{text: "ERROR_NO_SLOT_AVAILABLE", kind: Backoff, wait: 5 * time.Second},
		{text: "MAX_USER_TURN", kind: Backoff, wait: 10 * time.Second},
		{text: "ERROR_ZERO_BALANCE", kind: Backoff, wait: time.Minute},
		{text: "IP_BANNED", kind: Backoff, wait: 5 * time.Minute},
		{text: "ERROR: 1001", kind: Backoff, wait: 10 * time.Minute},
		{text: "ERROR: 1005", kind: Backoff, wait: 5 * time.Minute},
		{text: "ERROR: 1099", kind: Backoff, wait: 5 * time.Minute},
		// Anything else that looks like an error is never delivered as a
		// result, nor is an empty answer.
		{text: "ERROR_SOMETHING_NEW", kind: Backoff},
		{text: "", kind: Backoff},
	}
	for _, tc := range tests {
		t.Run(tc.text, func(t *testing.T) {
			got := ClassifyLegacy(tc.text)
			if got.Kind != tc.kind || got.Code != tc.text || got.Wait != tc.wait {
				t.Errorf("ClassifyLegacy(%q) = {kind %d, text %q, wait %s}, want {kind %d, text %q, wait %s}",
					tc.text, got.Kind, got.Code, got.Wait, tc.kind, tc.text, tc.wait)
			}
		})
	}
}

func TestParseResAnswer(t *testing.T) {
	type want struct {
		kind Kind
		text string
	}
	tests := []struct {
		name    string
		body    string
		n       int
		want    []want
		wantErr bool
	}{
		{name: "single result", n: 1,
			body: `{"status":1,"request":"03AGdBq24PBCbwiDRaS"}`,
			want: []want{{Result, "03AGdBq24PBCbwiDRaS"}}},
		{name: "single result containing a pipe is not split", n: 1,
			body: `{"status":1,"request":"a1.2|r=eu-west-1|meta=3"}`,
			want: []want{{Result, "a1.2|r=eu-west-1|meta=3"}}},
		{name: "single not ready", n: 1,
			body: `{"status":0,"request":"CAPCHA_NOT_READY"}`,
			want: []want{{NotReady, "CAPCHA_NOT_READY"}}},
		{name: "single unsolvable", n: 1,
			body: `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`,
			want: []want{{TaskError, "ERROR_CAPTCHA_UNSOLVABLE"}}},
		{name: "status 0 is never a result", n: 1,
			body: `{"status":0,"request":"LOOKS_LIKE_A_TOKEN"}`,
			want: []want{{Backoff, "LOOKS_LIKE_A_TOKEN"}}},
		{name: "status 0 for a bulk request is one code", n: 3,
			body: `{"status":0,"request":"ERROR_WRONG_USER_KEY"}`,
			want: []want{{KeyError, "ERROR_WRONG_USER_KEY"}}},
		{name: "status 0 no slot for a bulk request", n: 2,
			body: `{"status":0,"request":"ERROR_NO_SLOT_AVAILABLE"}`,
			want: []want{{Backoff, "ERROR_NO_SLOT_AVAILABLE"}}},
		{name: "bulk, one element per id in order", n: 4,
			body: `{"status":1,"request":"TOKEN-A|CAPCHA_NOT_READY|ERROR_CAPTCHA_UNSOLVABLE|ERROR_WRONG_CAPTCHA_ID"}`,
			want: []want{
				{Result, "TOKEN-A"},
				{NotReady, "CAPCHA_NOT_READY"},
				{TaskError, "ERROR_CAPTCHA_UNSOLVABLE"},
				{UnknownTask, "ERROR_WRONG_CAPTCHA_ID"},
			}},
		{name: "bulk with an element missing returns what it got", n: 3,
			body: `{"status":1,"request":"TOKEN-A|TOKEN-B"}`,
			want: []want{{Result, "TOKEN-A"}, {Result, "TOKEN-B"}}},
		{name: "numeric request", n: 1,
			body: `{"status":1,"request":12345678901}`,
			want: []want{{Result, "12345678901"}}},
		{name: "object request is kept as its JSON text", n: 1,
			body: `{"status":1,"request":{"captcha_voucher":"v","existing_token":"t"}}`,
			want: []want{{Result, `{"captcha_voucher":"v","existing_token":"t"}`}}},
		{name: "empty single result is not a result", n: 1,
			body: `{"status":1,"request":""}`,
			want: []want{{Backoff, ""}}},
		{name: "HTML error page", n: 1, wantErr: true,
			body: "<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"},
		{name: "plain text answer", n: 1, wantErr: true, body: "OK|TOKEN"},
		{name: "empty body", n: 1, wantErr: true, body: ""},
		{name: "JSON without request", n: 1, wantErr: true, body: `{"status":1}`},
		{name: "JSON null request", n: 1, wantErr: true, body: `{"status":1,"request":null}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseResAnswer([]byte(tc.body), tc.n)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("ParseResAnswer(%q) = %+v, want an error", tc.body, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseResAnswer(%q): %v", tc.body, err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("ParseResAnswer(%q) gave %d answers, want %d: %+v", tc.body, len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				if got[i].Kind != w.kind || got[i].Code != w.text {
					t.Errorf("answer %d = {kind %d, text %q}, want {kind %d, text %q}", i, got[i].Kind, got[i].Code, w.kind, w.text)
				}
			}
		})
	}
}

func TestParseSubmitAnswer(t *testing.T) {
	tests := []struct {
		name, body string
		id         string
		ok         bool
	}{
		{"plain", "OK|2122988149", "2122988149", true},
		{"plain with whitespace", " OK|2122988149\r\n", "2122988149", true},
		{"JSON string id", `{"status":1,"request":"2122988149"}`, "2122988149", true},
		{"JSON numeric id", `{"status":1,"request":2122988149}`, "2122988149", true},
		{"JSON numeric id beyond 2^53", `{"status":1,"request":12345678901234567890}`, "12345678901234567890", true},
		{"JSON with extra fields", `{"status":1,"request":"77","error_text":""}`, "77", true},
		{"plain error", "ERROR_ZERO_BALANCE", "", false},
		{"JSON error", `{"status":0,"request":"ERROR_ZERO_BALANCE"}`, "", false},
		{"JSON status 0 with a number", `{"status":0,"request":77}`, "", false},
		{"empty plain id", "OK|", "", false},
		{"empty JSON id", `{"status":1,"request":""}`, "", false},
		{"null request", `{"status":1,"request":null}`, "", false},
		{"no request", `{"status":1}`, "", false},
		{"negative number", `{"status":1,"request":-5}`, "", false},
		{"fraction", `{"status":1,"request":1.5}`, "", false},
		{"exponent", `{"status":1,"request":1e10}`, "", false},
		{"object request", `{"status":1,"request":{"id":"77"}}`, "", false},
		{"HTML page", "<html><body>502 Bad Gateway</body></html>", "", false},
		{"empty", "", "", false},
		{"lower-case ok", "ok|77", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, ok := ParseInAnswer([]byte(tc.body))
			if id != tc.id || ok != tc.ok {
				t.Errorf("ParseInAnswer(%q) = %q, %v; want %q, %v", tc.body, id, ok, tc.id, tc.ok)
			}
		})
	}
}

func TestParseResultAnswer(t *testing.T) {
	tests := []struct {
		name, body string
		code       string
		ok         bool
	}{
		{"plain token", "OK|03AGdBq25-TOKEN", "03AGdBq25-TOKEN", true},
		{"plain answer with |", "OK|x=12,y=34|x=56,y=78", "x=12,y=34|x=56,y=78", true},
		{"plain answer starting with |", "OK||a", "|a", true},
		{"plain with newline", "OK|abc\n", "abc", true},
		{"JSON string", `{"status":1,"request":"03AGdBq25-TOKEN"}`, "03AGdBq25-TOKEN", true},
		{"JSON string with |", `{"status":1,"request":"a|b|c"}`, "a|b|c", true},
		{"JSON with extra fields", `{"status":1,"request":"0.4uMM","useragent":"Mozilla/5.0"}`, "0.4uMM", true},
		{"JSON object request", `{"status":1,"request":{"captcha_voucher":"v","existing_token":"t"}}`, `{"captcha_voucher":"v","existing_token":"t"}`, true},
		{"JSON number request", `{"status":1,"request":1234}`, "1234", true},
		{"plain not ready", "CAPCHA_NOT_READY", "", false},
		{"JSON not ready", `{"status":0,"request":"CAPCHA_NOT_READY"}`, "", false},
		{"plain task error", "ERROR_CAPTCHA_UNSOLVABLE", "", false},
		{"JSON task error", `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`, "", false},
		{"empty plain result", "OK|", "", false},
		{"empty JSON result", `{"status":1,"request":""}`, "", false},
		{"null request", `{"status":1,"request":null}`, "", false},
		{"HTML page", "<html>OK</html>", "", false},
		{"empty", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, ok := parseResultAnswer([]byte(tc.body))
			if code != tc.code || ok != tc.ok {
				t.Errorf("parseResultAnswer(%q) = %q, %v; want %q, %v", tc.body, code, ok, tc.code, tc.ok)
			}
		})
	}
}

func TestParseTaskError(t *testing.T) {
	tests := []struct {
		body, code string
		ok         bool
	}{
		{"ERROR_CAPTCHA_UNSOLVABLE", "ERROR_CAPTCHA_UNSOLVABLE", true},
		{"ERROR_CAPTCHA_UNSOLVABLE\r\n", "ERROR_CAPTCHA_UNSOLVABLE", true},
		{`{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`, "ERROR_CAPTCHA_UNSOLVABLE", true},
		{`{"status":0,"request":"ERROR_TOKEN_EXPIRED","error_text":"expired"}`, "ERROR_TOKEN_EXPIRED", true},
		{"CAPCHA_NOT_READY", "", false},
		{`{"status":0,"request":"CAPCHA_NOT_READY"}`, "", false},
		{"ERROR_NO_SLOT_AVAILABLE", "", false},
		{"ERROR_WRONG_CAPTCHA_ID", "", false},
		{"ERROR_WRONG_USER_KEY", "", false},
		{`{"status":0,"request":"ERROR: 1005"}`, "", false},
		{"OK|ERROR_CAPTCHA_UNSOLVABLE", "", false},
		{"<html>ERROR_CAPTCHA_UNSOLVABLE</html>", "", false},
		{"", "", false},
	}
	for _, tc := range tests {
		code, ok := parseTaskError([]byte(tc.body))
		if ok != tc.ok || (ok && code != tc.code) {
			t.Errorf("parseTaskError(%q) = %q, %v; want %q, %v", tc.body, code, ok, tc.code, tc.ok)
		}
	}
}

func TestLocalResAnswerWithoutKeptAnswer(t *testing.T) {
	tests := []struct {
		name     string
		asJSON   bool
		code     string
		wantType string
		want     string
	}{
		{"plain result", false, "03AGdBq25-TOKEN", "text/plain", "OK|03AGdBq25-TOKEN"},
		{"plain result with |", false, "x=1,y=2|x=3,y=4", "text/plain", "OK|x=1,y=2|x=3,y=4"},
		{"plain task error", false, "ERROR_CAPTCHA_UNSOLVABLE", "text/plain", "ERROR_CAPTCHA_UNSOLVABLE"},
		{"JSON result", true, "03AGdBq25-TOKEN", "application/json", `{"status":1,"request":"03AGdBq25-TOKEN"}`},
		{"JSON result with quotes", true, `say "hi"`, "application/json", `{"status":1,"request":"say \"hi\""}`},
		{"JSON task error", true, "ERROR_CAPTCHA_UNSOLVABLE", "application/json", `{"status":0,"request":"ERROR_CAPTCHA_UNSOLVABLE"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body, ct := LocalResAnswer(tc.code, nil, tc.asJSON)
			if string(body) != tc.want {
				t.Errorf("got %q, want %q", body, tc.want)
			}
			if !strings.HasPrefix(ct, tc.wantType) {
				t.Errorf("Content-Type %q, want %s", ct, tc.wantType)
			}
			if tc.asJSON {
				code, ok := parseResultAnswer(body)
				if wantOK := !strings.HasPrefix(tc.code, "ERROR"); ok != wantOK || (ok && code != tc.code) {
					t.Errorf("reads back as %q, %v", code, ok)
				}
			}
		})
	}
}
