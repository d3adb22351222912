package protocol

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// Answers below are the documented examples, shortened: anti-captcha's
// getTaskResult page (https://anti-captcha.com/apidoc/methods/getTaskResult),
// 2captcha's API v2 (https://2captcha.com/api-docs/get-task-result,
// https://2captcha.com/api-docs/create-task), CapSolver's createTask guide
// (https://docs.capsolver.com/guide/api-createtask) and CapMonster's error
// types (https://zennolab.atlassian.net/wiki/spaces/APIS/pages/295396/Error+Types).

const docReady = `{"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"3AHJ_VuvYIBNBW5yyv0zRYJ75VkOKvhKj9_xGBJKnQimF72rfoq3Iy-DyGHMwLAo6a3"},"cost":"0.001500","ip":"46.98.54.221","createTime":1472205564,"endTime":1472205570,"solveCount":0}`

func TestParseTaskResult(t *testing.T) {
	tests := []struct {
		name string
		body string
		kind Kind
		code string
		wait time.Duration
		raw  bool // Raw is the whole answer
	}{
		{"anti-captcha ready", docReady, Result, `{"gRecaptchaResponse":"3AHJ_VuvYIBNBW5yyv0zRYJ75VkOKvhKj9_xGBJKnQimF72rfoq3Iy-DyGHMwLAo6a3"}`, 0, true},
		{"2captcha v2 ready, two members sorted", `{"errorId":0,"status":"ready","solution":{"token":"T","gRecaptchaResponse":"T"},"cost":"0.00299","ip":"1.2.3.4","createTime":1692863536,"endTime":1692863556,"solveCount":1}`,
			Result, `{"gRecaptchaResponse":"T","token":"T"}`, 0, true},
		{"solution with spaces and HTML characters", `{"errorId":0,"status":"ready","solution":{ "text" : "a<b>&c" , "n": 1.50 }}`,
			Result, `{"n":1.50,"text":"a<b>&c"}`, 0, true},
		{"processing", `{"errorId":0,"status":"processing"}`, NotReady, "processing", 0, false},
		{"unsolvable", `{"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE","errorDescription":"Workers could not solve the Captcha"}`, TaskError, "ERROR_CAPTCHA_UNSOLVABLE", 0, true},
		{"unknown task", `{"errorId":16,"errorCode":"ERROR_NO_SUCH_CAPCHA_ID","errorDescription":"Task you are requesting does not exist"}`, UnknownTask, "ERROR_NO_SUCH_CAPCHA_ID", 0, false},
		{"unknown task, other spelling", `{"errorId":16,"errorCode":"ERROR_NO_SUCH_CAPTCHA_ID"}`, UnknownTask, "ERROR_NO_SUCH_CAPTCHA_ID", 0, false},
		{"bad key", `{"errorId":1,"errorCode":"ERROR_KEY_DOES_NOT_EXIST","errorDescription":"Account authorization key not found in the system"}`, KeyError, "ERROR_KEY_DOES_NOT_EXIST", 0, false},
		{"zero balance", `{"errorId":10,"errorCode":"ERROR_ZERO_BALANCE"}`, Backoff, "ERROR_ZERO_BALANCE", time.Minute, false},
		{"too many requests", `{"errorId":3,"errorCode":"ERROR_TOO_MUCH_REQUESTS"}`, Backoff, "ERROR_TOO_MUCH_REQUESTS", 10 * time.Minute, false},
		{"new error code", `{"errorId":99,"errorCode":"ERROR_SOMETHING_NEW"}`, Backoff, "ERROR_SOMETHING_NEW", 0, false},
		{"error without code", `{"errorId":7}`, Backoff, "errorId 7", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ParseTaskResult([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if a.Kind != tc.kind || a.Code != tc.code || a.Wait != tc.wait {
				t.Errorf("got {%s %q %s}, want {%s %q %s}", a.Kind, a.Code, a.Wait, tc.kind, tc.code, tc.wait)
			}
			if tc.raw != (string(a.Raw) == tc.body) {
				t.Errorf("Raw %q; want the whole answer: %v", a.Raw, tc.raw)
			}
		})
	}
	for _, bad := range []string{"", "<html>502 Bad Gateway</html>", `{"status":"ready"}`, `{"errorId":0,"status":"ready"}`,
		`{"errorId":0,"status":"ready","solution":null}`, `{"errorId":0}`, `{"errorId":"x"}`, `[1]`, `{"errorId":0,"status":"processing"} x`} {
		if a, err := ParseTaskResult([]byte(bad)); err == nil {
			t.Errorf("ParseTaskResult(%q) = %+v, want an error", bad, a)
		}
	}
}

func TestParseCreateTaskAnswer(t *testing.T) {
	tests := []struct {
		name, body string
		id         string
		ok, sync   bool
	}{
		{"anti-captcha", `{"errorId":0,"taskId":7654321}`, "7654321", true, false},
		{"2captcha v2", `{"errorId":0,"taskId":72345678901}`, "72345678901", true, false},
		{"string id", `{"errorId":0,"taskId":"37223a89-06ed-442c-a0b8-22067b79c5b4"}`, "37223a89-06ed-442c-a0b8-22067b79c5b4", true, false},
		{"CapSolver synchronous", `{"errorId":0,"status":"ready","solution":{"text":"44795sds"},"taskId":"2dc7b1a4-3d1f-4a52-8bb0-11e1b1cbd4c1"}`, "2dc7b1a4-3d1f-4a52-8bb0-11e1b1cbd4c1", true, true},
		{"error", `{"errorId":1,"errorCode":"ERROR_KEY_DOES_NOT_EXIST","errorDescription":"..."}`, "", false, false},
		{"no task id", `{"errorId":0}`, "", false, false},
		{"negative id", `{"errorId":0,"taskId":-4}`, "", false, false},
		{"HTML", `<html></html>`, "", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, sync, ok := ParseCreateTaskAnswer([]byte(tc.body))
			if id != tc.id || ok != tc.ok || (sync != nil) != tc.sync {
				t.Fatalf("got %q, %v, %v; want %q, %v, sync %v", id, sync, ok, tc.id, tc.ok, tc.sync)
			}
			if sync != nil && (sync.Code != `{"text":"44795sds"}` || string(sync.Raw) != tc.body) {
				t.Errorf("sync answer %+v", sync)
			}
		})
	}
}

func TestParseCreateTask(t *testing.T) {
	body := `{"clientKey":"dce6bcbb1a728ea8d871de6d169a2057","task":{"type":"RecaptchaV2TaskProxyless","websiteURL":"https://a.example","websiteKey":"6Le-wvkSVVABCPBMRTvw0Q4Muexq1bi0DJwx_mJ-"},"softId":0}`
	ct, ok := ParseCreateTask([]byte(body))
	if !ok || ct.ClientKey != "dce6bcbb1a728ea8d871de6d169a2057" || ct.TaskType != "RecaptchaV2TaskProxyless" || ct.CallbackURL != "" {
		t.Errorf("got %+v, %v", ct, ok)
	}
	ct, ok = ParseCreateTask([]byte(`{"task":{"type":"ImageToTextTask"},"callbackUrl":"https://x.example/cb"}`))
	if !ok || ct.CallbackURL != "https://x.example/cb" || ct.TaskType != "ImageToTextTask" {
		t.Errorf("got %+v, %v", ct, ok)
	}
	for _, bad := range []string{"", "clientKey=x", "[]", `{"a":1`} {
		if _, ok := ParseCreateTask([]byte(bad)); ok {
			t.Errorf("ParseCreateTask(%q) ok", bad)
		}
	}
}

func TestAddCallbackURL(t *testing.T) {
	const u = "https://example.com/pingback/anticaptcha?t=a&b=<c>"
	q := `"https://example.com/pingback/anticaptcha?t=a&b=<c>"`
	tests := []struct {
		name, body, want string
		ok               bool
	}{
		{"appended last", `{"clientKey":"k","task":{"type":"T","callbackUrl":null}}`, `{"clientKey":"k","task":{"type":"T","callbackUrl":null},"callbackUrl":` + q + `}`, true},
		{"spacing kept", "{\n  \"clientKey\": \"k\"\n}\n", "{\n  \"clientKey\": \"k\"\n,\"callbackUrl\":" + q + "}\n", true},
		{"empty object", `{ }`, `{ "callbackUrl":` + q + `}`, true},
		{"null first taken out", `{"callbackUrl": null, "clientKey":"k"}`, `{ "clientKey":"k","callbackUrl":` + q + `}`, true},
		{"null in the middle taken out", `{"a":1, "callbackUrl":null ,"b":2}`, `{"a":1 ,"b":2,"callbackUrl":` + q + `}`, true},
		{"empty last taken out", `{"clientKey":"k","callbackUrl":""}`, `{"clientKey":"k","callbackUrl":` + q + `}`, true},
		{"null alone", `{"callbackUrl":null}`, `{"callbackUrl":` + q + `}`, true},
		{"twice", `{"callbackUrl":null,"callbackUrl":null}`, "", false},
		{"set one kept", `{"callbackUrl":"https://own.example/"}`, "", false},
		{"not an object", `["x"]`, "", false},
		{"malformed", `{"a":`, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := AddCallbackURL([]byte(tc.body), u)
			if ok != tc.ok || string(got) != tc.want {
				t.Fatalf("got %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
			if ok {
				ct, _ := ParseCreateTask(got)
				if ct.CallbackURL != u {
					t.Errorf("reads back callbackUrl %q", ct.CallbackURL)
				}
			}
		})
	}
}

func TestJSONCallbackBody(t *testing.T) {
	anti, _ := Lookup("anticaptcha")
	capsolver, _ := Lookup("capsolver")
	got := anti.JSONCallbackBody("7654321", []byte(docReady))
	if want := `{"taskId":7654321,` + docReady[1:]; string(got) != want {
		t.Errorf("anti-captcha: got %s\nwant %s", got, want)
	}
	got = capsolver.JSONCallbackBody("2dc7b1a4-3d1f", []byte(`{"errorId":0,"status":"ready","solution":{"text":"x"}}`))
	if want := `{"taskId":"2dc7b1a4-3d1f","errorId":0,"status":"ready","solution":{"text":"x"}}`; string(got) != want {
		t.Errorf("capsolver: got %s", got)
	}
	withID := `{"taskId":5,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`
	if got := anti.JSONCallbackBody("5", []byte(withID)); string(got) != withID {
		t.Errorf("answer with a taskId changed: %s", got)
	}
	// What the plugin sends, the pingback handler reads back.
	cb, err := anti.ParseJSONCallback(anti.JSONCallbackBody("7654321", []byte(docReady)))
	if err != nil || cb.ID != "7654321" || !strings.Contains(cb.Code, "gRecaptchaResponse") {
		t.Errorf("read back %+v, %v", cb, err)
	}
}

func TestLocalTaskResult(t *testing.T) {
	for _, tc := range []struct {
		raw string
		ok  bool
	}{
		{docReady, true},
		{`{"taskId":5,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`, true},
		{`{"errorId":"0","status":"ready","solution":{"a":1}}`, false}, // errorId must be a number
		{`{"errorId":0,"status":"processing"}`, false},
		{`{"id":"5","code":"T"}`, false},
		{`{"status":1,"request":"T"}`, false},
		{``, false},
	} {
		got, ok := LocalTaskResult([]byte(tc.raw))
		if ok != tc.ok || (ok && string(got) != tc.raw) {
			t.Errorf("LocalTaskResult(%q) = %q, %v; want %v", tc.raw, got, ok, tc.ok)
		}
	}
}

func TestGetTaskResultRequest(t *testing.T) {
	anti, _ := Lookup("anticaptcha")
	capsolver, _ := Lookup("capsolver")
	if got := string(anti.GetTaskResultRequest("k\"ey", "7654321")); got != `{"clientKey":"k\"ey","taskId":7654321}` {
		t.Errorf("anti-captcha: %s", got)
	}
	if got := string(capsolver.GetTaskResultRequest("k", "ab-12")); got != `{"clientKey":"k","taskId":"ab-12"}` {
		t.Errorf("capsolver: %s", got)
	}
	key, id, ok := ParseGetTaskResultRequest(anti.GetTaskResultRequest("k", "7654321"))
	if !ok || key != "k" || id != "7654321" {
		t.Errorf("read back %q %q %v", key, id, ok)
	}
}

func TestFormCode(t *testing.T) {
	for sol, want := range map[string]string{
		`{"gRecaptchaResponse":"G","token":"T"}`: "T",
		`{"gRecaptchaResponse":"G"}`:             "G",
		`{"text":"abc"}`:                         "abc",
		`{"userAgent":"UA"}`:                     "UA",
		`{"a":1,"b":2}`:                          `{"a":1,"b":2}`,
		`{"b":{"y":1,"x":2},"a":[1]}`:            `{"a":[1],"b":{"x":2,"y":1}}`,
	} {
		if got := FormCode([]byte(sol)); got != want {
			t.Errorf("FormCode(%s) = %q, want %q", sol, got, want)
		}
	}
}

func TestCanonicalJSON(t *testing.T) {
	got, err := CanonicalJSON([]byte(" { \"b\" : [ 1 , {\"d\":1e3,\"c\":\"\\u003c\"} ], \"a\" : null } "))
	if err != nil || got != `{"a":null,"b":[1,{"c":"<","d":1e3}]}` {
		t.Errorf("got %s, %v", got, err)
	}
	if _, err := CanonicalJSON([]byte(`{} {}`)); err == nil {
		t.Error("trailing data accepted")
	}
	var v any
	if json.Unmarshal([]byte(got), &v) != nil {
		t.Error("not JSON")
	}
}
