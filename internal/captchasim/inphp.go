package captchasim

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// serveIn handles in.php, the submit endpoint (source: docs/protocols.md
// §1.2, §1.3). Parameters may come as a GET query, a POST
// application/x-www-form-urlencoded body or a POST multipart/form-data body.
// Used parameters: key, method, json (0/1), pingback, file (multipart
// upload, method=post) and body (base64 image, method=base64); others are
// ignored. Answers:
//
//	OK|12345678901                      json=0
//	{"status":1,"request":"12345678901"} json=1
//	{"status":1,"request":12345678901}   json=1, method=userrecaptcha, NumericJSONIDs
//	ERROR_WRONG_USER_KEY                 json=0 error (likewise other codes)
//	{"status":0,"request":"ERROR_WRONG_USER_KEY"}
//
// The task belongs to the key's account (Config.Key or one of Config.Keys).
//
// Errors: ERROR_WRONG_USER_KEY (key missing or not accepted), the key's
// KeyFault.Code when its Submits is set,
// ERROR_BAD_PARAMETERS (method missing or malformed, pingback not an
// absolute http(s) URL, unreadable body), ERROR_ZERO_CAPTCHA_FILESIZE (no or
// empty image for post/base64), ERROR_IMAGE_TYPE_NOT_SUPPORTED (body is not
// base64), ERROR_TOO_BIG_CAPTCHA_FILESIZE (image over 600 kB or request over
// 2 MiB), ERROR_NO_SLOT_AVAILABLE (SubmitNoSlotRate), and HTML 5xx pages
// (SubmitServerErrorRate).
//
// Deviation: real providers answer ERROR_KEY_DOES_NOT_EXIST for a
// well-formed unknown key and require sitekey/pageurl for token methods;
// the simulator does neither.
func (s *Sim) serveIn(w http.ResponseWriter, r *http.Request) {
	p, perr := parseParams(w, r)
	asJSON := p.get("json") == "1"
	now := s.cfg.Now()

	s.mu.Lock()
	s.sweepLocked(now)
	s.st.InCalls++
	if a := s.byKey[p.get("key")]; a != nil {
		a.st.InCalls++
	}
	if s.chance(s.cfg.SubmitServerErrorRate) {
		status := serverErrorStatuses[s.rng.IntN(len(serverErrorStatuses))]
		s.st.ServerErrors++
		s.mu.Unlock()
		s.log.Info("in.php: injected server error", "status", status)
		writeServerError(w, status)
		return
	}
	a, method, pingback, code := s.checkSubmitLocked(p, perr)
	if code != "" {
		s.st.SubmitErrors++
		s.mu.Unlock()
		s.log.Info("in.php: rejected", "code", code, "method", method)
		writeCode(w, asJSON, code)
		return
	}
	t := s.newTaskLocked(a, method, pingback, now, false)
	s.mu.Unlock()

	s.log.Info("in.php: task accepted", "id", t.id, "account", a.index, "method", method, "pingback", pingback, "solve_in", t.delay)
	if asJSON && s.cfg.NumericJSONIDs && method == "userrecaptcha" {
		writeJSON(w, reply{Status: 1, Request: json.Number(t.id)})
		return
	}
	writeOK(w, asJSON, true, t.id)
}

// checkSubmitLocked validates a submit and returns its account, method
// and pingback, or the error code to answer. s.mu must be held
// (SubmitNoSlotRate draws).
func (s *Sim) checkSubmitLocked(p params, perr error) (a *account, method, pingback, code string) {
	method = p.get("method")
	a = s.byKey[p.get("key")]
	switch {
	case errors.Is(perr, errTooBig):
		return a, method, "", CodeTooBigFileSize
	case perr != nil:
		return a, method, "", CodeBadParameters
	case a == nil:
		return nil, method, "", CodeWrongUserKey
	}
	if a.fault.Submits {
		if code := resFaultLocked(a); code != "" {
			return a, method, "", code
		}
	}
	if !validMethod(method) {
		return a, method, "", CodeBadParameters
	}
	if s.chance(s.cfg.SubmitNoSlotRate) {
		s.st.NoSlots++
		return a, method, "", CodeNoSlot
	}
	switch method {
	case "post":
		if len(p.file) == 0 {
			return a, method, "", CodeZeroFileSize
		}
	case "base64":
		if code := checkBase64(p.get("body")); code != "" {
			return a, method, "", code
		}
	}
	pingback = p.get("pingback")
	if pingback != "" && !validPingback(pingback) {
		return a, method, "", CodeBadParameters
	}
	return a, method, pingback, ""
}

// checkBase64 validates a method=base64 image body (standard alphabet,
// padding optional, whitespace ignored) and returns an error code or "".
func checkBase64(body string) string {
	body = strings.Join(strings.Fields(body), "")
	if body == "" {
		return CodeZeroFileSize
	}
	if base64.StdEncoding.DecodedLen(len(body)) > maxImageBytes+3 {
		return CodeTooBigFileSize
	}
	img, err := base64.StdEncoding.DecodeString(body)
	if err != nil {
		img, err = base64.RawStdEncoding.DecodeString(body)
	}
	switch {
	case err != nil:
		return CodeImageNotSupported
	case len(img) == 0:
		return CodeZeroFileSize
	case len(img) > maxImageBytes:
		return CodeTooBigFileSize
	}
	return ""
}
