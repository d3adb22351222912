package pingback

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/caddy-pingback/pingback/internal/protocol"
)

// FuzzReadJSONCallback: a JSON callback to a JSON-API provider is never
// refused (4xx) when one of its id keys (taskId, id, task_id) holds a valid
// task id and it carries a result (errorId absent or 0, and a non-null
// solution or a non-empty string code); an errorId callback is either a
// result (a task-final error) or a *protocol.NotResultError, never a
// stored account error; what is accepted keeps the body byte for byte.
func FuzzReadJSONCallback(f *testing.F) {
	for _, s := range []string{
		`{"taskId":5,"errorId":0,"status":"ready","solution":{"gRecaptchaResponse":"T"}}`,
		`{"taskId":null,"id":5,"code":"T"}`,
		`{"taskId":"x","task_id":"5","solution":{"a":1}}`,
		`{"taskId":{},"id":[],"task_id":7,"solution":"s"}`,
		`{"taskId":5,"errorId":12,"errorCode":"ERROR_CAPTCHA_UNSOLVABLE"}`,
		`{"taskId":5,"errorId":1,"errorCode":"ERROR_KEY_DOES_NOT_EXIST"}`,
		`{"taskId":5,"errorId":"1"}`,
		`{"id":"5","code":""}`,
	} {
		f.Add("application/json", []byte(s))
		f.Add("text/plain", []byte(s))
	}
	p := mustProvider("anticaptcha")
	f.Fuzz(func(t *testing.T, contentType string, body []byte) {
		r := &http.Request{
			Method: http.MethodPost, URL: &url.URL{Path: "/cb"}, Header: http.Header{},
			Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Host: "example.com",
		}
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		cb, err := readCallback(httptest.NewRecorder(), r, p, fuzzMaxBody)
		var nr *protocol.NotResultError
		var bad *badRequest
		switch {
		case errors.As(err, &nr):
			if !p.ValidID(nr.ID) || nr.Answer.Kind == protocol.TaskError || nr.Answer.Kind == protocol.Result {
				t.Fatalf("not-a-result %+v from %q", nr, body)
			}
			return
		case errors.As(err, &bad):
			if len(body) > fuzzMaxBody {
				return
			}
			var v map[string]json.RawMessage
			if !looksLikeJSONObject(body) || json.Unmarshal(body, &v) != nil {
				return
			}
			if e, ok := v["errorId"]; ok && string(e) != "0" {
				return
			}
			valid := false
			for _, k := range []string{"taskId", "id", "task_id"} {
				var s string
				var n json.Number
				switch {
				case json.Unmarshal(v[k], &s) == nil:
					valid = valid || p.ValidID(s)
				case json.Unmarshal(v[k], &n) == nil:
					valid = valid || p.ValidID(n.String())
				}
			}
			var code string
			hasResult := (v["solution"] != nil && string(v["solution"]) != "null") ||
				(json.Unmarshal(v["code"], &code) == nil && code != "")
			if valid && hasResult {
				t.Fatalf("refused %d %q, though it carries a valid id and a result: %q", bad.status, bad.reason, body)
			}
			return
		case err != nil:
			t.Fatalf("error %v (%T)", err, err)
		}
		if !p.ValidID(cb.id) || cb.code == "" || !bytes.Equal(cb.body, body) {
			t.Fatalf("accepted id %q code %q from %q", cb.id, cb.code, body)
		}
	})
}
