package captchasim

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddy-pingback/pingback/internal/testkit"
)

// pngHeader is a few bytes standing in for a captcha image.
var pngHeader = []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR captcha image")

// checkAnswerShape fails unless answer has the shape method's answers have.
func checkAnswerShape(t *testing.T, method, answer string) {
	t.Helper()
	switch method {
	case "post", "base64":
		if len(answer) < 4 || len(answer) > 6 || strings.Trim(answer, upperDigits) != "" {
			t.Errorf("%s answer %q is not a short text answer", method, answer)
		}
	case "funcaptcha":
		if strings.Count(answer, "|") < 2 {
			t.Errorf("funcaptcha answer %q has no '|' characters", answer)
		}
	default:
		if strings.Contains(answer, "|") || len(answer) < 100 {
			t.Errorf("%s answer %q is not a long token without '|'", method, answer)
		}
	}
}

func TestSubmitEncodings(t *testing.T) {
	b64 := base64.StdEncoding.EncodeToString(pngHeader)
	kv := func(pairs ...string) url.Values {
		v := url.Values{}
		for i := 0; i+1 < len(pairs); i += 2 {
			v.Add(pairs[i], pairs[i+1])
		}
		return v
	}
	tests := []struct {
		name   string
		method string
		json   bool
		send   func(t *testing.T, base string, v url.Values) response
		extra  url.Values
		file   []byte
	}{
		{name: "GET query userrecaptcha", method: "userrecaptcha",
			send: func(t *testing.T, b string, v url.Values) response { return get(t, b, "in.php", v) }},
		{name: "GET query hcaptcha json", method: "hcaptcha", json: true,
			send: func(t *testing.T, b string, v url.Values) response { return get(t, b, "in.php", v) }},
		{name: "POST form turnstile", method: "turnstile",
			send: func(t *testing.T, b string, v url.Values) response { return postForm(t, b, "in.php", v) }},
		{name: "POST form base64 json", method: "base64", json: true, extra: kv("body", b64),
			send: func(t *testing.T, b string, v url.Values) response { return postForm(t, b, "in.php", v) }},
		{name: "POST form key in query", method: "funcaptcha",
			send: func(t *testing.T, b string, v url.Values) response {
				req, _ := http.NewRequest(http.MethodPost, b+"/in.php?key="+testKey, strings.NewReader("method=funcaptcha"))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				return do(t, req)
			}},
		{name: "multipart file post", method: "post", file: pngHeader,
			send: nil},
		{name: "multipart file post json", method: "post", json: true, file: pngHeader,
			send: nil},
		{name: "multipart base64 body", method: "base64", extra: kv("body", b64),
			send: nil},
		{name: "multipart funcaptcha", method: "funcaptcha",
			send: nil},
	}
	s, base := startSim(t, Config{SolveMin: 10 * time.Millisecond, SolveMax: 30 * time.Millisecond})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := kv("key", testKey, "method", tc.method, "soft_id", "123", "googlekey", "ignored")
			if tc.json {
				v.Set("json", "1")
			}
			for k, vs := range tc.extra {
				v[k] = vs
			}
			var r response
			if tc.send != nil {
				r = tc.send(t, base, v)
			} else {
				r = postMultipart(t, base, "in.php", v, tc.file)
			}
			if r.status != http.StatusOK {
				t.Fatalf("status %d, body %q", r.status, r.body)
			}
			var id string
			if tc.json {
				rep := decodeReply(t, r.body)
				if rep.Status != 1 {
					t.Fatalf("status field %d, body %q", rep.Status, r.body)
				}
				id = rep.requestString(t)
			} else {
				var ok bool
				if id, ok = strings.CutPrefix(r.body, "OK|"); !ok {
					t.Fatalf("body %q, want OK|<id>", r.body)
				}
			}
			if len(id) != 11 || !isDigits(id) {
				t.Fatalf("id %q is not an 11-digit number", id)
			}
			info, ok := s.Task(id)
			if !ok || info.Method != tc.method {
				t.Fatalf("Task(%s) = %+v, %v", id, info, ok)
			}

			// The answer arrives through res.php once solved.
			var answer string
			testkit.WaitFor(t, 3*time.Second, "task "+id+" solved", func() bool {
				r := res(t, base, url.Values{"action": {"get"}, "id": {id}})
				a, ok := strings.CutPrefix(r.body, "OK|")
				if !ok && r.body != CodeNotReady {
					t.Fatalf("res.php get: %q", r.body)
				}
				answer = a
				return ok
			})
			if answer != info.Code {
				t.Errorf("answer %q, Task says %q", answer, info.Code)
			}
			checkAnswerShape(t, tc.method, answer)
		})
	}
	if st := s.Stats(); st.Submits != int64(len(tests)) || st.SubmitErrors != 0 {
		t.Errorf("stats: submits %d, submit errors %d; want %d, 0", st.Submits, st.SubmitErrors, len(tests))
	}
}

func TestSubmitErrors(t *testing.T) {
	big := make([]byte, maxImageBytes+1)
	tests := []struct {
		name string
		send func(t *testing.T, base string) response
		json bool
		want string
	}{
		{name: "wrong key", want: CodeWrongUserKey, send: func(t *testing.T, b string) response {
			return get(t, b, "in.php", url.Values{"key": {"nope"}, "method": {"userrecaptcha"}})
		}},
		{name: "wrong key json", json: true, want: CodeWrongUserKey, send: func(t *testing.T, b string) response {
			return get(t, b, "in.php", url.Values{"key": {"nope"}, "method": {"userrecaptcha"}, "json": {"1"}})
		}},
		{name: "missing key", want: CodeWrongUserKey, send: func(t *testing.T, b string) response {
			return postForm(t, b, "in.php", url.Values{"method": {"userrecaptcha"}})
		}},
		{name: "missing method", want: CodeBadParameters, send: func(t *testing.T, b string) response {
			return get(t, b, "in.php", url.Values{"key": {testKey}})
		}},
		{name: "missing method json", json: true, want: CodeBadParameters, send: func(t *testing.T, b string) response {
			return postMultipart(t, b, "in.php", url.Values{"key": {testKey}, "json": {"1"}}, nil)
		}},
		{name: "malformed method", want: CodeBadParameters, send: func(t *testing.T, b string) response {
			return get(t, b, "in.php", url.Values{"key": {testKey}, "method": {"Post;DROP"}})
		}},
		{name: "post without file", want: CodeZeroFileSize, send: func(t *testing.T, b string) response {
			return postMultipart(t, b, "in.php", url.Values{"key": {testKey}, "method": {"post"}}, nil)
		}},
		{name: "post with empty file", want: CodeZeroFileSize, send: func(t *testing.T, b string) response {
			return postMultipart(t, b, "in.php", url.Values{"key": {testKey}, "method": {"post"}}, []byte{})
		}},
		{name: "post by GET", want: CodeZeroFileSize, send: func(t *testing.T, b string) response {
			return get(t, b, "in.php", url.Values{"key": {testKey}, "method": {"post"}})
		}},
		{name: "post file too big", want: CodeTooBigFileSize, send: func(t *testing.T, b string) response {
			return postMultipart(t, b, "in.php", url.Values{"key": {testKey}, "method": {"post"}}, big)
		}},
		{name: "base64 empty", want: CodeZeroFileSize, send: func(t *testing.T, b string) response {
			return postForm(t, b, "in.php", url.Values{"key": {testKey}, "method": {"base64"}})
		}},
		{name: "base64 garbage", want: CodeImageNotSupported, send: func(t *testing.T, b string) response {
			return postForm(t, b, "in.php", url.Values{"key": {testKey}, "method": {"base64"}, "body": {"!!not base64!!"}})
		}},
		{name: "base64 too big", want: CodeTooBigFileSize, send: func(t *testing.T, b string) response {
			return postForm(t, b, "in.php", url.Values{"key": {testKey}, "method": {"base64"}, "body": {base64.StdEncoding.EncodeToString(big)}})
		}},
		{name: "request over 2 MiB", want: CodeTooBigFileSize, send: func(t *testing.T, b string) response {
			return postForm(t, b, "in.php", url.Values{"key": {testKey}, "method": {"base64"}, "body": {strings.Repeat("A", maxRequestBytes)}})
		}},
		{name: "pingback not http", want: CodeBadParameters, send: func(t *testing.T, b string) response {
			return get(t, b, "in.php", url.Values{"key": {testKey}, "method": {"hcaptcha"}, "pingback": {"ftp://example.com/x"}})
		}},
		{name: "pingback relative", want: CodeBadParameters, send: func(t *testing.T, b string) response {
			return get(t, b, "in.php", url.Values{"key": {testKey}, "method": {"hcaptcha"}, "pingback": {"/cb"}})
		}},
	}
	s, base := startSim(t, Config{SolveMin: never, SolveMax: never})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.send(t, base)
			if r.status != http.StatusOK {
				t.Fatalf("status %d, body %q", r.status, r.body)
			}
			if !tc.json {
				if r.body != tc.want {
					t.Errorf("body %q, want %q", r.body, tc.want)
				}
				return
			}
			rep := decodeReply(t, r.body)
			if rep.Status != 0 || rep.requestString(t) != tc.want {
				t.Errorf("body %q, want {\"status\":0,\"request\":%q}", r.body, tc.want)
			}
		})
	}
	st := s.Stats()
	if st.Submits != 0 || st.SubmitErrors != int64(len(tests)) || st.InCalls != int64(len(tests)) {
		t.Errorf("stats: submits %d, errors %d, calls %d; want 0, %d, %d", st.Submits, st.SubmitErrors, st.InCalls, len(tests), len(tests))
	}
}

func TestNumericJSONIDs(t *testing.T) {
	tests := []struct {
		name    string
		numeric bool
		method  string
		json    bool
		want    string // "number", "string" or "plain"
	}{
		{"userrecaptcha numeric", true, "userrecaptcha", true, "number"},
		{"hcaptcha stays string", true, "hcaptcha", true, "string"},
		{"plain unaffected", true, "userrecaptcha", false, "plain"},
		{"flag off", false, "userrecaptcha", true, "string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, base := startSim(t, Config{SolveMin: never, SolveMax: never, NumericJSONIDs: tc.numeric})
			v := url.Values{"key": {testKey}, "method": {tc.method}}
			if tc.json {
				v.Set("json", "1")
			}
			r := get(t, base, "in.php", v)
			switch tc.want {
			case "plain":
				if !strings.HasPrefix(r.body, "OK|") {
					t.Errorf("body %q, want OK|<id>", r.body)
				}
			case "number":
				rep := decodeReply(t, r.body)
				if _, err := strconv.ParseUint(string(rep.Request), 10, 64); err != nil || rep.Status != 1 {
					t.Errorf("body %q, want a numeric request", r.body)
				}
			case "string":
				rep := decodeReply(t, r.body)
				if id := rep.requestString(t); !isDigits(id) || rep.Status != 1 {
					t.Errorf("body %q, want a digit-string request", r.body)
				}
			}
		})
	}
}

func TestIDsAreSeededAndIncreasing(t *testing.T) {
	ids := func(seed uint64) []string {
		_, base := startSim(t, Config{Seed: seed, SolveMin: never, SolveMax: never})
		var out []string
		for range 3 {
			out = append(out, submit(t, base, "hcaptcha", nil))
		}
		return out
	}
	a, b, c := ids(7), ids(7), ids(8)
	if strings.Join(a, ",") != strings.Join(b, ",") {
		t.Errorf("same seed gave %v and %v", a, b)
	}
	if a[0] == c[0] {
		t.Errorf("seeds 7 and 8 both start at %s", a[0])
	}
	for i, id := range a {
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil || len(id) != 11 {
			t.Fatalf("id %q is not an 11-digit number", id)
		}
		if i > 0 {
			prev, _ := strconv.ParseUint(a[i-1], 10, 64)
			if n != prev+1 {
				t.Errorf("ids %v do not increase by one", a)
			}
		}
	}
}
