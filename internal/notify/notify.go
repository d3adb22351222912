// Package notify POSTs the plugin's operational events to one URL the
// operator gives, as signed JSON, for users with no other alerting.
//
// It guarantees that [Notifier.Notify] never blocks on the network nor on
// a log line (it takes a mutex that no POST or log write is made under,
// adds to a map and returns), so it may be called on a
// pingback's path; that at most one message per event name and provider
// leaves per interval, carrying the count and the first and last time of
// the events it stands for; that a POST the receiver refuses (a transport
// error or a status other than 2xx) is retried with backoff from 5 s to
// 10 min and given up after a day with one log line; that at most
// [MaxQueued] messages wait, the oldest dropped first with a throttled log
// line; that its lines name the receiver by scheme and host only (a chat
// webhook's path or query is often its credential); and that
// [Notifier.Stop] returns once its goroutine has.
//
// It relies on its caller to put nothing secret in an event's data: the
// data is sent as given.
package notify

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Limits and defaults of a Notifier.
const (
	// DefaultInterval is the coalescing interval when Config.Interval is 0.
	DefaultInterval = 5 * time.Minute
	// MaxQueued is the most messages that wait to be sent; beyond it the
	// oldest are dropped.
	MaxQueued = 1000
	// BackoffMin and BackoffMax bound the wait before a refused POST is
	// tried again: it doubles from BackoffMin up to BackoffMax.
	BackoffMin = 5 * time.Second
	BackoffMax = 10 * time.Minute
	// GiveUpAfter is how long a message is retried before it is dropped.
	GiveUpAfter = 24 * time.Hour
	// Gather is how long the first event of a quiet event name and
	// provider waits for others, so that a burst leaves as one message.
	Gather = time.Second
	// maxBatch is the most messages in one POST.
	maxBatch = 100
	// dropLogEvery throttles the line that says messages were dropped.
	dropLogEvery = time.Minute
	// postTimeout bounds one POST.
	postTimeout = 30 * time.Second
)

// SignatureHeader is the header that carries a POST's signature:
// "sha256=" and the hex HMAC-SHA256 of the raw body keyed with the secret.
const SignatureHeader = "X-Pingback-Signature"

// Event is one thing that happened, as the plugin emits it.
type Event struct {
	// Name is the event's name (pingback_result_parked, ...).
	Name string
	// Provider is the provider it concerns; empty for none (the store).
	Provider string
	// Count is how many things it stands for (at least 1 is assumed).
	Count int
	// FirstAt and LastAt are when the first and last of them happened
	// (LastAt zero: FirstAt).
	FirstAt, LastAt time.Time
	// Data is the event's data, sent as given (it must hold no secret).
	Data map[string]any
}

// Message is one element of a POST's JSON array: the events of one name
// and provider coalesced over an interval.
type Message struct {
	Event    string `json:"event"`
	Provider string `json:"provider"`
	// Count is how many events (or things, for a summarised event) the
	// message stands for.
	Count int `json:"count"`
	// FirstAt and LastAt are when the first and last of them happened
	// (RFC 3339).
	FirstAt time.Time `json:"first_at"`
	LastAt  time.Time `json:"last_at"`
	// Data is the data of the latest event the message stands for.
	Data map[string]any `json:"data,omitempty"`
}

// Config configures a Notifier.
type Config struct {
	// URL receives the POSTs (http or https).
	URL string
	// Secret keys the signature of each POST.
	Secret string
	// Interval is the coalescing interval (0: DefaultInterval).
	Interval time.Duration
	// Client sends the POSTs (nil: a client with no timeout of its own;
	// each POST is bounded by 30 s).
	Client *http.Client
	// Logger writes the notifier's few lines (nil: none).
	Logger *zap.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Notifier coalesces events and POSTs them; see the package doc.
type Notifier struct {
	url      string
	logURL   string // url's scheme and host: what the lines name (its path or query may be a credential)
	secret   []byte
	interval time.Duration
	client   *http.Client
	logger   *zap.Logger
	now      func() time.Time
	tick     time.Duration // how often the goroutine looks for work

	wake   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	pending  map[coalesceKey]*gathering
	lastSent map[coalesceKey]time.Time
	queue    []queued
	seq      uint64
	failures int       // refused POSTs in a row
	nextTry  time.Time // no POST before it (backoff)
	dropped  int       // messages dropped since the last drop line
	dropLog  time.Time // when the last drop line was written
}

type coalesceKey struct{ event, provider string }

// gathering is the events of one key not yet turned into a message.
type gathering struct {
	msg   Message
	since time.Time // when the first of them was noted
	order uint64    // the order of the first of them among all gatherings
}

// queued is a message waiting to be sent.
type queued struct {
	seq      uint64
	msg      Message
	firstTry time.Time // zero until a POST carried it
}

// New returns a notifier for cfg; Start starts it.
func New(cfg Config) *Notifier {
	n := &Notifier{
		url: cfg.URL, logURL: logURL(cfg.URL), secret: []byte(cfg.Secret), interval: cfg.Interval,
		client: cfg.Client, logger: cfg.Logger, now: cfg.Now, tick: time.Second,
		wake:     make(chan struct{}, 1),
		pending:  make(map[coalesceKey]*gathering),
		lastSent: make(map[coalesceKey]time.Time),
	}
	if n.interval <= 0 {
		n.interval = DefaultInterval
	}
	if n.client == nil {
		n.client = new(http.Client)
	}
	if n.logger == nil {
		n.logger = zap.NewNop()
	}
	if n.now == nil {
		n.now = time.Now
	}
	return n
}

// Notify notes ev; it never blocks on the network.
func (n *Notifier) Notify(ev Event) {
	if ev.Count < 1 {
		ev.Count = 1
	}
	if ev.FirstAt.IsZero() {
		ev.FirstAt = n.now()
	}
	if ev.LastAt.IsZero() {
		ev.LastAt = ev.FirstAt
	}
	k := coalesceKey{ev.Name, ev.Provider}
	n.mu.Lock()
	g := n.pending[k]
	if g == nil {
		n.seq++
		g = &gathering{msg: Message{Event: ev.Name, Provider: ev.Provider, FirstAt: ev.FirstAt.UTC()}, since: n.now(), order: n.seq}
		n.pending[k] = g
	}
	g.msg.Count += ev.Count
	if ev.FirstAt.Before(g.msg.FirstAt) {
		g.msg.FirstAt = ev.FirstAt.UTC()
	}
	if ev.LastAt.After(g.msg.LastAt) {
		g.msg.LastAt = ev.LastAt.UTC()
	}
	g.msg.Data = ev.Data
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// Start starts the goroutine that coalesces and sends; Stop stops it.
func (n *Notifier) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan struct{})
	go n.run(ctx)
}

// Stop stops the goroutine (cutting a POST in flight) and waits for it;
// the messages still waiting are dropped. Stop without Start does nothing.
func (n *Notifier) Stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	<-n.done
}

// run looks for work every tick and whenever an event is noted.
func (n *Notifier) run(ctx context.Context) {
	defer close(n.done)
	t := time.NewTicker(n.tick)
	defer t.Stop()
	for {
		now := n.now()
		n.collect(now)
		n.send(ctx, now)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.wake:
		}
	}
}

// collect turns the gatherings that are due at now into queued messages:
// a gathering is due Gather after its first event, and no sooner than
// interval after the last message of its key. Its line is written after
// the mutex is released: Notify never waits for a log sink.
func (n *Notifier) collect(now time.Time) {
	if dropped := n.collectLocked(now); dropped > 0 {
		n.logger.Warn("notify queue full: the oldest messages were dropped",
			zap.Int("dropped", dropped), zap.Int("max_queued", MaxQueued))
	}
}

// collectLocked is collect under the mutex; it returns the messages
// dropped to report now (0: no line due).
func (n *Notifier) collectLocked(now time.Time) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	var due []coalesceKey
	for k, g := range n.pending {
		at := g.since.Add(min(Gather, n.interval))
		if last, ok := n.lastSent[k]; ok {
			if next := last.Add(n.interval); next.After(at) {
				at = next
			}
		}
		if !now.Before(at) {
			due = append(due, k)
		}
	}
	// In the order their first events came, so that the oldest are
	// dropped first.
	slices.SortFunc(due, func(x, y coalesceKey) int { return cmp.Compare(n.pending[x].order, n.pending[y].order) })
	for _, k := range due {
		n.seq++
		n.queue = append(n.queue, queued{seq: n.seq, msg: n.pending[k].msg})
		delete(n.pending, k)
		n.lastSent[k] = now
	}
	for k, last := range n.lastSent {
		if now.Sub(last) >= n.interval && n.pending[k] == nil {
			delete(n.lastSent, k)
		}
	}
	if over := len(n.queue) - MaxQueued; over > 0 {
		n.queue = append(n.queue[:0:0], n.queue[over:]...)
		n.dropped += over
	}
	if n.dropped > 0 && (n.dropLog.IsZero() || now.Sub(n.dropLog) >= dropLogEvery) {
		dropped := n.dropped
		n.dropped, n.dropLog = 0, now
		return dropped
	}
	return 0
}

// send POSTs the oldest waiting messages (up to maxBatch) unless the
// backoff of a refused POST holds; messages tried for GiveUpAfter are
// dropped with one line.
func (n *Notifier) send(ctx context.Context, now time.Time) {
	n.mu.Lock()
	if len(n.queue) == 0 || now.Before(n.nextTry) {
		n.mu.Unlock()
		return
	}
	gaveUp := 0
	for len(n.queue) > 0 && !n.queue[0].firstTry.IsZero() && now.Sub(n.queue[0].firstTry) >= GiveUpAfter {
		n.queue = n.queue[1:]
		gaveUp++
	}
	batch := make([]Message, 0, min(len(n.queue), maxBatch))
	var last uint64
	for i := range n.queue[:min(len(n.queue), maxBatch)] {
		if n.queue[i].firstTry.IsZero() {
			n.queue[i].firstTry = now
		}
		batch = append(batch, n.queue[i].msg)
		last = n.queue[i].seq
	}
	n.mu.Unlock()
	if gaveUp > 0 {
		n.logger.Error("notify messages given up: the receiver refused them for a day",
			zap.Int("messages", gaveUp), zap.String("url", n.logURL))
	}
	if len(batch) == 0 {
		return
	}
	err := n.post(ctx, batch)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		n.mu.Lock()
		n.failures++
		first := n.failures == 1
		wait := BackoffMin << min(n.failures-1, 16)
		n.nextTry = now.Add(min(wait, BackoffMax))
		n.mu.Unlock()
		if first { // written without the mutex: Notify never waits for it
			n.logger.Warn("notify receiver refused a POST; retrying with backoff",
				zap.String("url", n.logURL), zap.Error(err))
		}
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.failures, n.nextTry = 0, time.Time{}
	i := 0
	for i < len(n.queue) && n.queue[i].seq <= last {
		i++
	}
	n.queue = n.queue[i:]
	if len(n.queue) > 0 {
		select {
		case n.wake <- struct{}{}:
		default:
		}
	}
}

// post sends one signed POST of batch; an error for a refused one.
func (n *Notifier) post(ctx context.Context, batch []Message) error {
	body, err := json.Marshal(batch)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, postTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign(n.secret, body))
	resp, err := n.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			return ue.Err // without the URL, which the lines must not carry
		}
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// logURL is u's scheme and host, as the notifier's lines name the
// receiver: a chat webhook's path or query is often its credential.
func logURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable url)"
	}
	return p.Scheme + "://" + p.Host
}

// Sign returns the signature header's value for body: "sha256=" and the
// hex HMAC-SHA256 of body keyed with secret.
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Queued returns how many messages wait to be sent.
func (n *Notifier) Queued() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.queue)
}
