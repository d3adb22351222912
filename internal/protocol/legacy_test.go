package protocol

import (
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// Structured answers from the per-method sections of
// https://2captcha.com/2captcha-api: Turnstile in challenge-page mode (with
// useragent), Amazon WAF (an object request), GeeTest (JSON request).
const (
	docTurnstile = `{"status":1,"request":"0.4uMMZZdSfsVM8...610cd090","useragent":"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36"}`
	docAmazonWAF = `{"status":1,"request":{"captcha_voucher":"eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1...","existing_token":"f8ab5749-f916-..."}}`
	docGeeTest   = `{"status":1,"request":{"geetest_challenge":"1ad03db8aff920037fb8117827eab171gu","geetest_validate":"011309d29dab6a2e8eb8b7a1e5b15f8c","geetest_seccode":"011309d29dab6a2e8eb8b7a1e5b15f8c|jordan"}}`
)

func TestStructuredResAnswersKeepTheWholeAnswer(t *testing.T) {
	for _, body := range []string{docTurnstile, docAmazonWAF, docGeeTest} {
		got, err := ParseResAnswer([]byte(body), 1)
		if err != nil || len(got) != 1 || got[0].Kind != Result {
			t.Fatalf("ParseResAnswer(%s) = %+v, %v", body, got, err)
		}
		if string(got[0].Raw) != body {
			t.Errorf("Raw %q, want the whole answer", got[0].Raw)
		}
		// Answered locally, json=1, exactly as the provider answered.
		local, ct := LocalResAnswer(got[0].Code, got[0].Raw, true)
		if string(local) != body || ct != "application/json" {
			t.Errorf("local json=1 answer %q (%s), want %q", local, ct, body)
		}
		seen, ok := SeenResAnswer([]byte(body))
		if !ok || seen.Code != got[0].Code || string(seen.Raw) != body {
			t.Errorf("SeenResAnswer = %+v, %v", seen, ok)
		}
	}
	// A structured result without its kept answer is still an object.
	local, _ := LocalResAnswer(`{"captcha_voucher":"v","existing_token":"t"}`, nil, true)
	if want := `{"status":1,"request":{"captcha_voucher":"v","existing_token":"t"}}`; string(local) != want {
		t.Errorf("got %s, want %s", local, want)
	}
	// Plain requests for structured results get the JSON answer, as res.php
	// "will always return the response as JSON for Geetest".
	got, _ := ParseResAnswer([]byte(docGeeTest), 1)
	if local, _ := LocalResAnswer(got[0].Code, got[0].Raw, false); string(local) != docGeeTest {
		t.Errorf("json=0 GeeTest answer %q", local)
	}
	// A plain token stays plain for json=0.
	got, _ = ParseResAnswer([]byte(docTurnstile), 1)
	if local, _ := LocalResAnswer(got[0].Code, got[0].Raw, false); string(local) != "OK|0.4uMMZZdSfsVM8...610cd090" {
		t.Errorf("json=0 Turnstile answer %q", local)
	}
}

func TestExtraFields(t *testing.T) {
	got := ExtraFields([]byte(docTurnstile))
	want := [][2]string{{"useragent", "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := ExtraFields([]byte(docAmazonWAF)); got != nil {
		t.Errorf("Amazon WAF: got %q, want none", got)
	}
	if got := ExtraFields(nil); got != nil {
		t.Errorf("nil: got %q", got)
	}
}

func TestLegacyCallbackQuery(t *testing.T) {
	tests := []struct {
		raw, id, code string
		extra         [][2]string
		want          string
	}{
		// The app's own query stays byte for byte: order, encoding, case.
		{"z=1&a=%7e&token=S%2Fe+c", "77", "T&x", nil, "z=1&a=%7e&token=S%2Fe+c&id=77&code=T%26x"},
		{"", "77", "T", nil, "id=77&code=T"},
		{"t=1&", "77", "T", nil, "t=1&id=77&code=T"},
		{"t=1", "77", "T", [][2]string{{"useragent", "Mozilla/5.0 (X)"}}, "t=1&id=77&code=T&useragent=Mozilla%2F5.0+%28X%29"},
	}
	for _, tc := range tests {
		got := LegacyCallbackQuery(tc.raw, tc.id, tc.code, tc.extra)
		if got != tc.want {
			t.Errorf("LegacyCallbackQuery(%q) = %q, want %q", tc.raw, got, tc.want)
		}
		// The provider's fields read back from it.
		q, _ := url.ParseQuery(got)
		if q.Get("id") != tc.id || q.Get("code") != tc.code {
			t.Errorf("%q reads back id %q code %q", got, q.Get("id"), q.Get("code"))
		}
	}
	if got := string(LegacyCallbackForm("51555263943", "ANSWER", nil)); got != "id=51555263943&code=ANSWER" {
		t.Errorf("form: %q", got)
	}
}

func TestParseFormCallback(t *testing.T) {
	p, _ := Lookup("2captcha")
	cb, err := p.ParseFormCallback(url.Values{"id": {"51555263943"}, "code": {"ANSWER"}})
	if err != nil || cb.ID != "51555263943" || cb.Code != "ANSWER" || cb.Answer != nil {
		t.Errorf("got %+v, %v", cb, err)
	}
	for _, bad := range []url.Values{{"code": {"x"}}, {"id": {"1"}}, {"id": {"1", "2"}, "code": {"x"}}, {"id": {"a1"}, "code": {"x"}}, {"id": {"1"}, "code": {""}}} {
		if _, err := p.ParseFormCallback(bad); !IsCallbackError(err) {
			t.Errorf("ParseFormCallback(%v) = %v, want a CallbackError", bad, err)
		}
	}
}

func TestParseJSONCallback(t *testing.T) {
	anti, _ := Lookup("anticaptcha")
	capsolver, _ := Lookup("capsolver")
	tests := []struct {
		name string
		p    Provider
		body string
		id   string
		code string
		err  string
	}{
		{"anti-captcha: getTaskResult with taskId", anti, `{"taskId":7654321,` + docReady[1:], "7654321",
			`{"gRecaptchaResponse":"3AHJ_VuvYIBNBW5yyv0zRYJ75VkOKvhKj9_xGBJKnQimF72rfoq3Iy-DyGHMwLAo6a3"}`, ""},
		{"task-final error", anti, `{"taskId":5,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE","errorDescription":"..."}`, "5", "ERROR_CAPTCHA_UNSOLVABLE", ""},
		{"null taskId, valid id", anti, `{"taskId":null,"id":5,"code":"TOKEN"}`, "5", "TOKEN", ""},
		{"malformed taskId, valid task_id", anti, `{"taskId":"12a","task_id":"5","status":"ready","solution":{"text":"x"}}`, "5", `{"text":"x"}`, ""},
		{"valid taskId wins over a malformed id", anti, `{"taskId":5,"id":{},"solution":{"text":"x"}}`, "5", `{"text":"x"}`, ""},
		{"capsolver: null taskId, uuid id", capsolver, `{"taskId":null,"id":"37223a89-06ed-442c-a0b8-22067b79c5b4","solution":{"text":"x"}}`,
			"37223a89-06ed-442c-a0b8-22067b79c5b4", `{"text":"x"}`, ""},
		{"every id key malformed", anti, `{"taskId":null,"id":"x","task_id":[],"solution":{"text":"x"}}`, "", "", "malformed taskId"},
		{"string taskId", anti, `{"taskId":"5","status":"ready","solution":{"text":"x"}}`, "5", `{"text":"x"}`, ""},
		{"id and code", anti, `{"id":5,"code":"TOKEN"}`, "5", "TOKEN", ""},
		{"task_id and solution string", anti, `{"task_id":"5","solution":"TOKEN"}`, "5", `"TOKEN"`, ""},
		{"capsolver uuid", capsolver, `{"taskId":"37223a89-06ed-442c-a0b8-22067b79c5b4","errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`,
			"37223a89-06ed-442c-a0b8-22067b79c5b4", `{"gRecaptchaResponse":"T"}`, ""},
		{"processing", anti, `{"taskId":5,"errorId":0,"status":"processing"}`, "", "", "no result"},
		{"no id", anti, `{"status":"ready","solution":{"text":"x"}}`, "", "", "missing taskId"},
		{"bad id", anti, `{"taskId":"12a","solution":{"text":"x"}}`, "", "", "malformed taskId"},
		{"object id", anti, `{"taskId":{},"solution":{"text":"x"}}`, "", "", "malformed taskId"},
		{"uuid for a digits provider", anti, `{"taskId":"37223a89-06ed","solution":{"text":"x"}}`, "", "", "malformed taskId"},
		{"not JSON", anti, `taskId=5`, "", "", "malformed JSON"},
		{"bad errorId", anti, `{"taskId":5,"errorId":[1]}`, "", "", "malformed errorId"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cb, err := tc.p.ParseJSONCallback([]byte(tc.body))
			if tc.err != "" {
				if err == nil || !IsCallbackError(err) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want error %q", cb, err, tc.err)
				}
				return
			}
			if err != nil || cb.ID != tc.id || cb.Code != tc.code || string(cb.Answer) != tc.body {
				t.Errorf("got %+v, %v; want id %q code %q", cb, err, tc.id, tc.code)
			}
		})
	}
}

// TestParseJSONCallbackNotResult: an errorId above 0 is a result only for
// a task-final error (anti-captcha's error list,
// https://anti-captcha.com/apidoc/errors; CapMonster's,
// https://zennolab.atlassian.net/wiki/spaces/APIS/pages/295396/Error+Types):
// account, key, rate and unknown-task errors, and codes the taxonomy does
// not know, name the task but are no result.
func TestParseJSONCallbackNotResult(t *testing.T) {
	anti, _ := Lookup("anticaptcha")
	capsolver, _ := Lookup("capsolver")
	tests := []struct {
		name string
		p    Provider
		body string
		id   string
		kind Kind
		code string
	}{
		{"key error", anti, `{"taskId":5,"errorId":1,"errorCode":"ERROR_KEY_DOES_NOT_EXIST","errorDescription":"Account authorization key not found in the system"}`,
			"5", KeyError, "ERROR_KEY_DOES_NOT_EXIST"},
		{"zero balance", anti, `{"taskId":5,"errorId":10,"errorCode":"ERROR_ZERO_BALANCE"}`, "5", Backoff, "ERROR_ZERO_BALANCE"},
		{"no slot", anti, `{"taskId":"5","errorId":2,"errorCode":"ERROR_NO_SLOT_AVAILABLE"}`, "5", Backoff, "ERROR_NO_SLOT_AVAILABLE"},
		{"unknown task", anti, `{"taskId":5,"errorId":16,"errorCode":"ERROR_NO_SUCH_CAPCHA_ID"}`, "5", UnknownTask, "ERROR_NO_SUCH_CAPCHA_ID"},
		{"error without a code", anti, `{"taskId":5,"errorId":31}`, "5", Backoff, "ERROR_ID_31"},
		{"unknown code, id under task_id", capsolver, `{"task_id":"37223a89-06ed-442c-a0b8-22067b79c5b4","errorId":1,"errorCode":"ERROR_SOMETHING_NEW"}`,
			"37223a89-06ed-442c-a0b8-22067b79c5b4", Backoff, "ERROR_SOMETHING_NEW"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cb, err := tc.p.ParseJSONCallback([]byte(tc.body))
			var nr *NotResultError
			if !errors.As(err, &nr) || IsCallbackError(err) {
				t.Fatalf("got %+v, %v; want a *NotResultError", cb, err)
			}
			if nr.ID != tc.id || nr.Answer.Kind != tc.kind || nr.Answer.Code != tc.code {
				t.Errorf("got %+v; want id %q %s %q", nr, tc.id, tc.kind, tc.code)
			}
		})
	}
}

func TestProviders(t *testing.T) {
	want := map[string]struct {
		legacy, json string
		ack          string
	}{
		"captchaai":   {"https://ocr.captchaai.com", "", "2s"},
		"2captcha":    {"https://2captcha.com", "https://api.2captcha.com", "2s"},
		"rucaptcha":   {"https://rucaptcha.com", "https://api.rucaptcha.com", "2s"},
		"anticaptcha": {"", "https://api.anti-captcha.com", "1s"},
		"capmonster":  {"", "https://api.capmonster.cloud", "1s"},
		"capsolver":   {"", "https://api.capsolver.com", "2s"},
	}
	if got := Names(); len(got) != len(want) {
		t.Fatalf("providers %v", got)
	}
	for name, w := range want {
		p, ok := Lookup(name)
		if !ok || p.LegacyEndpoint != w.legacy || p.JSONEndpoint != w.json || p.AckTimeout.String() != w.ack {
			t.Errorf("%s: %+v", name, p)
		}
	}
	cm, _ := Lookup("capmonster")
	if cm.Retention.String() != "5m0s" || cm.MaxResultCalls != 120 {
		t.Errorf("capmonster limits %+v", cm)
	}
}
