package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// Every parser of this package is fuzzed: no panic, no answer that
// contradicts the input, and what is passed through or kept is the input
// byte for byte.

func addSeeds(f *testing.F, seeds ...string) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
}

var answerSeeds = []string{
	docReady, docTurnstile, docAmazonWAF, docGeeTest,
	`{"errorId":0,"status":"processing"}`, `{"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`,
	`{"errorId":0,"taskId":7654321}`, `{"errorId":0,"taskId":"ab-1","status":"ready","solution":{"text":"x"}}`,
	"OK|2122988149", `{"status":1,"request":2122988149}`, `{"status":0,"request":"CAPCHA_NOT_READY"}`,
	`{"status":1,"request":"A|CAPCHA_NOT_READY|ERROR_WRONG_CAPTCHA_ID"}`, "ERROR_CAPTCHA_UNSOLVABLE",
	"<html>502</html>", "", "{", `{"errorId":"0"}`, `{"taskId":1e3}`,
}

func FuzzLegacyAnswers(f *testing.F) {
	addSeeds(f, answerSeeds...)
	f.Fuzz(func(t *testing.T, body []byte) {
		if id, ok := ParseInAnswer(body); ok && id == "" {
			t.Fatal("empty id accepted")
		}
		for n := 1; n <= 3; n++ {
			answers, err := ParseResAnswer(body, n)
			if err != nil {
				continue
			}
			if len(answers) == 0 {
				t.Fatal("no answer and no error")
			}
			for _, a := range answers {
				if a.Kind == Result && a.Code == "" {
					t.Fatal("empty result")
				}
				if a.Raw != nil && !bytes.Equal(a.Raw, trimJSONSpace(body)) {
					t.Fatalf("Raw %q is not the answer %q", a.Raw, body)
				}
			}
		}
		if a, ok := SeenResAnswer(body); ok {
			if !a.Final() || a.Code == "" {
				t.Fatalf("seen %+v", a)
			}
			local, _ := LocalResAnswer(a.Code, a.Raw, true)
			if a.Raw != nil && !bytes.Equal(local, a.Raw) {
				t.Fatalf("local answer %q, kept %q", local, a.Raw)
			}
			if !json.Valid(local) {
				t.Fatalf("local json=1 answer %q is not JSON", local)
			}
		}
		_ = ExtraFields(body)
	})
}

func FuzzJSONAnswers(f *testing.F) {
	addSeeds(f, answerSeeds...)
	anti, _ := Lookup("anticaptcha")
	capsolver, _ := Lookup("capsolver")
	f.Fuzz(func(t *testing.T, body []byte) {
		if a, err := ParseTaskResult(body); err == nil {
			if a.Kind == Result {
				if !json.Valid([]byte(a.Code)) || !bytes.Equal(a.Raw, trimJSONSpace(body)) {
					t.Fatalf("result %+v of %q", a, body)
				}
				// Canonical: stable under a second pass.
				if again, err := CanonicalJSON([]byte(a.Code)); err != nil || again != a.Code {
					t.Fatalf("code %q not canonical (%q, %v)", a.Code, again, err)
				}
			}
			if a.Final() && !hasMember(a.Raw, "taskId") {
				for _, p := range []Provider{anti, capsolver} {
					cb := p.JSONCallbackBody("12345", a.Raw)
					got, err := p.ParseJSONCallback(cb)
					if err != nil {
						t.Fatalf("%s: own callback %q refused: %v", p.Name, cb, err)
					}
					if got.Code != a.Code && !strings.HasPrefix(got.Code, "ERROR") {
						t.Fatalf("%s: callback code %q, answer code %q", p.Name, got.Code, a.Code)
					}
				}
			}
		}
		if id, sync, ok := ParseCreateTaskAnswer(body); ok {
			if id == "" || (sync != nil && sync.Kind != Result) {
				t.Fatalf("createTask answer %q: %q %+v", body, id, sync)
			}
		}
		if raw, ok := LocalTaskResult(body); ok && !bytes.Equal(raw, body) {
			t.Fatal("local answer is not the kept one")
		}
		_, _, _ = ParseGetTaskResultRequest(body)
	})
}

func FuzzParseJSONCallback(f *testing.F) {
	addSeeds(f, answerSeeds...)
	addSeeds(f, `{"taskId":5,`+docReady[1:], `{"id":"5","code":"T"}`, `{"task_id":5,"errorId":12}`,
		`{"taskId":null,"id":5,"code":"T"}`, `{"taskId":"x","task_id":"5","solution":{"a":1}}`,
		`{"taskId":5,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`, `{"taskId":5,"errorId":1,"errorCode":"ERROR_KEY_DOES_NOT_EXIST"}`)
	providers := []Provider{}
	for _, n := range Names() {
		p, _ := Lookup(n)
		providers = append(providers, p)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, p := range providers {
			cb, err := p.ParseJSONCallback(body)
			var nr *NotResultError
			switch {
			case errors.As(err, &nr):
				// Names a task, carries no result: never a task-final error.
				if !p.ValidID(nr.ID) || nr.Answer.Kind == TaskError || nr.Answer.Kind == Result || IsCallbackError(err) {
					t.Fatalf("%s: not-a-result %+v from %q", p.Name, nr, body)
				}
				continue
			case err != nil:
				if !IsCallbackError(err) {
					t.Fatalf("%s: error %v is not a CallbackError", p.Name, err)
				}
				// A refused callback names no valid id under any key
				// and result it carries: no key may hold a valid id when
				// the refusal is about the id.
				if strings.HasPrefix(err.Error(), "malformed taskId") || strings.HasPrefix(err.Error(), "malformed id") || strings.HasPrefix(err.Error(), "malformed task_id") {
					var v map[string]json.RawMessage
					_ = json.Unmarshal(body, &v)
					for _, k := range []string{"taskId", "id", "task_id"} {
						if id, ok := jsonID(v[k]); ok && p.ValidID(id) {
							t.Fatalf("%s: %q refused (%v) though %s holds the valid id %q", p.Name, body, err, k, id)
						}
					}
				}
				continue
			}
			if !p.ValidID(cb.ID) || cb.Code == "" || !bytes.Equal(cb.Answer, body) {
				t.Fatalf("%s: accepted %+v from %q", p.Name, cb, body)
			}
		}
	})
}

func FuzzAddCallbackURL(f *testing.F) {
	addSeeds(f, `{"clientKey":"k","task":{"type":"T"}}`, `{}`, ` { "callbackUrl" : null } `, `{"callbackUrl":""}`,
		`{"callbackUrl":"x"}`, `{"a":"}"}`, `{"a":{"callbackUrl":null}}`, `{"callbackUrl":null,"callbackUrl":null}`)
	const u = "https://example.com/pingback/x?a=1&b=\"2\""
	q := string(quote(u))
	f.Fuzz(func(t *testing.T, body []byte) {
		ct, parsed := ParseCreateTask(body)
		out, ok := AddCallbackURL(body, u)
		if !ok {
			if parsed && ct.CallbackURL == "" && isObject(body) && !hasMember(body, "callbackUrl") {
				t.Fatalf("could not add to %q", body)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("result %q is not JSON", out)
		}
		back, _ := ParseCreateTask(out)
		if back.CallbackURL != u || back.ClientKey != ct.ClientKey || back.TaskType != ct.TaskType {
			t.Fatalf("%q → %q reads back %+v", body, out, back)
		}
		// Byte identity: without a callbackUrl member, the output is the
		// input with the member inserted before the closing brace; with a
		// null or empty one, the other members are the input's, in order,
		// byte for byte, and callbackUrl is the last member.
		if !hasMember(body, "callbackUrl") {
			end := bytes.LastIndexByte(body, '}')
			if !bytes.Equal(out[:end], body[:end]) || !bytes.Equal(out[len(out)-(len(body)-end):], body[end:]) {
				t.Fatalf("%q → %q is not the input with one insertion", body, out)
			}
			added := string(out[end : len(out)-(len(body)-end)])
			if added != `"callbackUrl":`+q && added != `,"callbackUrl":`+q {
				t.Fatalf("%q → %q added %q", body, out, added)
			}
			return
		}
		var in, got []string
		_ = eachMember(body, func(k string, v json.RawMessage) {
			if k != "callbackUrl" {
				in = append(in, k+"="+string(v))
			}
		})
		_ = eachMember(out, func(k string, v json.RawMessage) { got = append(got, k+"="+string(v)) })
		want := append(in, "callbackUrl="+q)
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Fatalf("%q → %q: members %q, want %q", body, out, got, want)
		}
	})
}

// hasMember reports whether a JSON object has a top-level member key,
// whatever its value.
func hasMember(body []byte, key string) bool {
	found := false
	_ = eachMember(body, func(k string, _ json.RawMessage) { found = found || k == key })
	return found
}
