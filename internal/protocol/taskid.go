package protocol

import "strings"

// Task ids. Legacy ids are digits: 2captcha's res.php rejects others with
// ERROR_WRONG_ID_FORMAT ("id must be numeric",
// https://2captcha.com/2captcha-api#res_errors), and CaptchaAI may send one
// as a JSON number, still digits. The JSON APIs of 2captcha, rucaptcha,
// anti-captcha and CapMonster give taskId as an integer
// (https://anti-captcha.com/apidoc/methods/createTask); CapSolver gives a
// UUID string (https://docs.capsolver.com/guide/api-createtask). The length
// bounds are our own generous ones, not documented limits.

// ValidID reports whether id is a well-formed task id of the provider (in
// its decimal-string form for numeric ids).
func (p Provider) ValidID(id string) bool {
	if p.UUIDTaskID {
		return validToken(id)
	}
	return validDigits(id)
}

// IDRule says in words what ValidID checks, for error messages.
func (p Provider) IDRule() string {
	if p.UUIDTaskID {
		return "1 to 64 letters, digits, '-' or '_'"
	}
	return "1 to 32 digits"
}

func validDigits(id string) bool {
	if len(id) < 1 || len(id) > 32 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < '0' || id[i] > '9' {
			return false
		}
	}
	return true
}

func validToken(id string) bool {
	if len(id) < 1 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// CanonicalID is the form of a valid task id under which the plugin
// deduplicates and stores it: decimal ids without leading zeros ("0123"
// and "123" are one task; "0" stays), UUID-style ids lower-cased
// (CapSolver shows them lower-case, https://docs.capsolver.com/guide/api-createtask).
// The request bytes are kept as sent; only the key is canonical.
func (p Provider) CanonicalID(id string) string {
	if p.UUIDTaskID {
		return strings.ToLower(id)
	}
	trimmed := strings.TrimLeft(id, "0")
	if trimmed == "" && id != "" {
		return "0"
	}
	return trimmed
}
