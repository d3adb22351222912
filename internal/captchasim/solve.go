package captchasim

import (
	"strconv"
	"strings"
	"time"
)

// answerKind is the shape of a method's answer.
type answerKind int

const (
	// answerText is a short image-captcha text such as "W9H5K".
	answerText answerKind = iota
	// answerToken is a long token without '|' (reCAPTCHA, hCaptcha,
	// Turnstile; source: docs/protocols.md §1.5).
	answerToken
	// answerPipeToken is a token that contains '|' characters (FunCaptcha,
	// KeyCaptcha; source: docs/protocols.md §1.5).
	answerPipeToken
)

// methodKinds maps the in.php methods with a known answer shape (source:
// docs/protocols.md §1.2, §1.5). Other well-formed methods get a token.
var methodKinds = map[string]answerKind{
	"post":          answerText,
	"base64":        answerText,
	"userrecaptcha": answerToken,
	"hcaptcha":      answerToken,
	"turnstile":     answerToken,
	"funcaptcha":    answerPipeToken,
	"keycaptcha":    answerPipeToken,
}

// validMethod reports whether m looks like an in.php method name: 1 to 32
// characters of [a-z0-9_].
func validMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

const (
	upperDigits = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	tokenChars  = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	hexChars    = "0123456789abcdef"
)

// randString draws n characters from alphabet. s.mu must be held.
func (s *Sim) randString(alphabet string, n int) string {
	var b strings.Builder
	b.Grow(n)
	for range n {
		b.WriteByte(alphabet[s.rng.IntN(len(alphabet))])
	}
	return b.String()
}

// answerFor draws an answer for method. s.mu must be held.
func (s *Sim) answerFor(method string) string {
	kind, ok := methodKinds[method]
	if !ok {
		kind = answerToken
	}
	switch kind {
	case answerText:
		return s.randString(upperDigits, 4+s.rng.IntN(3))
	case answerPipeToken:
		// Shaped like a FunCaptcha token: "<hex>.<digits>|r=...|meta=...|...".
		return s.randString(hexChars, 17) + "." + strconv.Itoa(1000000000+s.rng.IntN(9000000000)) +
			"|r=eu-west-1|meta=3|metabgclr=transparent|guitextcolor=%23000000|lang=en|pk=" +
			s.randString(upperDigits, 8) + "|at=40|ag=101|cdn_url=https%3A%2F%2Fclient-api.arkoselabs.com%2Fcdn%2Ffc|surl=https%3A%2F%2Fclient-api.arkoselabs.com"
	default:
		// Shaped like a reCAPTCHA token: "03A" + URL-safe base64 characters.
		return "03A" + s.randString(tokenChars, 157)
	}
}

// newTaskLocked creates, registers and schedules a task of account a.
// Every random decision about it is drawn here, in a fixed order, so a seed
// reproduces the same task whatever the timing. s.mu must be held.
func (s *Sim) newTaskLocked(a *account, method, pingback string, now time.Time, api bool) *task {
	t := &task{
		id:        strconv.FormatUint(s.nextID, 10),
		method:    method,
		pingback:  pingback,
		submitted: now,
		state:     StatePending,
		api:       api,
		account:   a.index,
	}
	s.nextID++
	if api && s.cfg.JSONFlavor == FlavorCapSolver {
		// A UUID-style id, drawn from the same source.
		t.id = s.randString(hexChars, 8) + "-" + s.randString(hexChars, 4) + "-4" + s.randString(hexChars, 3) +
			"-a" + s.randString(hexChars, 3) + "-" + s.randString(hexChars, 12)
	}
	t.delay = s.between(s.cfg.SolveMin, s.cfg.SolveMax)
	t.unsolv = s.chance(s.cfg.UnsolvableRate)
	t.answer = s.answerFor(method)
	t.drop = s.chance(s.cfg.DropRate)
	t.dup = s.chance(s.cfg.DuplicateRate)
	t.late = s.chance(s.cfg.LateRate)

	s.tasks[t.id] = t
	s.order = append(s.order, t)
	s.st.Submits++
	a.st.Submits++
	s.st.TasksPending++
	if !s.closed {
		id := t.id
		t.timer = time.AfterFunc(t.delay, func() { s.Solve(id) })
	}
	return t
}

// Solve solves the pending task id now, as if its solve timer had fired,
// including pingback delivery. It returns false when the task is unknown,
// forgotten or no longer pending, or the Sim is closed. Use it to avoid
// waiting in tests (set SolveMin high so timers never fire).
func (s *Sim) Solve(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	t := s.lookupLocked(id, s.cfg.Now())
	if t == nil || t.state != StatePending {
		return false
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	s.st.TasksPending--
	code := t.answer
	if t.unsolv {
		t.state = StateUnsolvable
		code = CodeUnsolvable
		s.st.TasksUnsolvable++
	} else {
		t.state = StateSolved
		s.st.TasksSolved++
	}
	t.solved = s.cfg.Now()
	s.log.Info("task solved", "id", t.id, "method", t.method, "state", string(t.state))
	if t.pingback == "" {
		return true
	}
	if t.drop {
		s.st.PingbacksDropped++
		s.log.Info("pingback dropped", "id", t.id)
		return true
	}
	var delay time.Duration
	if t.late {
		delay = s.cfg.LateDelay
		s.st.PingbacksLate++
	}
	sends := 1
	if t.dup {
		sends = 2
		s.st.PingbacksDuplicated++
	}
	// Add under s.mu while not closed, so Close's Wait cannot miss it.
	s.pingbacksRun.Add(1)
	if t.api {
		go s.deliverCalls(t.pingback, t.id, delay, sends, s.jsonCallbackLocked(t))
		return true
	}
	go s.deliver(t.pingback, t.id, code, delay, sends)
	return true
}
