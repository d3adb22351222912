package pingback

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/notify"
	"github.com/caddy-pingback/pingback/internal/store"
)

// The events the plugin emits into Caddy's events app (and to notify):
// what needs a person. Each event's data names the provider, a route,
// counts, times or an account id; never a code, an API key or a body.
const (
	EventResultParked         = "pingback_result_parked"
	EventResultsQuarantined   = "pingback_results_quarantined"
	EventRouteFailing         = "pingback_route_failing"
	EventRouteRecovered       = "pingback_route_recovered"
	EventProviderPaused       = "pingback_provider_paused"
	EventProviderResumed      = "pingback_provider_resumed"
	EventAPIKeyRejected       = "pingback_api_key_rejected"
	EventAccountOutOfBudget   = "pingback_account_out_of_budget"
	EventStoreUnavailable     = "pingback_store_unavailable"
	EventStoreAvailable       = "pingback_store_available"
	EventResultsExpiring      = "pingback_results_expiring"
	eventQueueSize            = 1024
	recentNotifications       = 50
	expiringNotice            = time.Hour // pingback_results_expiring: this much retention left
	expiringScanMax           = 10_000    // records looked at per housekeeping round, at least
	quarantineSummaryGathered = time.Second
)

// emitted is one event on its way to the events app.
type emitted struct {
	name string
	data map[string]any
}

// eventEmitter hands an app's events to its config's events app from one
// goroutine (Emit runs the handlers synchronously), and watches, while the
// app owns the loops, what is noticed by looking (the store's
// availability, routes failing, quarantine summaries).
type eventEmitter struct {
	queue    chan emitted
	stop     chan struct{}
	done     sync.WaitGroup
	notifier *notify.Notifier // nil without notify's url
	dropped  *throttledLog    // events dropped: the queue was full
}

// eventState is what the events of a store handle remember, in this
// process and across reloads. The zero value is ready to use.
type eventState struct {
	mu sync.Mutex
	// recent are the last recentNotifications events emitted, oldest
	// first.
	recent []adminapi.Notification
	// storeKnown and storeUp are the store's availability last seen.
	storeKnown, storeUp bool
	// quarantined are the quarantined pingbacks not yet summarised, and
	// quarantineSent when each provider's last summary was emitted.
	quarantined    map[string]*adminapi.Notification
	quarantineSent map[string]time.Time
	// expiringFrom and expiringTo are the window of received times
	// pingback_results_expiring last looked at (checkExpiring), and
	// expiringCursor where in it the next round goes on (nil: it was
	// looked at whole).
	expiringFrom, expiringTo time.Time
	expiringCursor           *store.Position
	// scanMax, if set, replaces expiringScanMax (tests).
	scanMax int
}

// emitEvent emits the event name about provider ("" for none) with data,
// which must hold no code, API key or body: into the config's events app
// (from the emitter's goroutine, never the caller's), to notify, and into
// the recent notifications of /pingback/status. It never blocks: with the
// queue full, the event is dropped from the events app (counted in a
// throttled log line) but still notified and listed. data may carry
// "count" (int, default 1) and "first_at" and "last_at" (RFC 3339) for an
// event that stands for several things.
func (a *App) emitEvent(name, provider string, data map[string]any) {
	now := a.now().UTC()
	d := make(map[string]any, len(data)+2)
	maps.Copy(d, data)
	d["provider"] = provider
	n := adminapi.Notification{Event: name, Provider: provider, Count: 1, FirstAt: now, LastAt: now}
	if c, ok := d["count"].(int); ok && c > 0 {
		n.Count = c
	} else {
		d["count"] = 1
	}
	if t, ok := parseRFC3339(d["first_at"]); ok {
		n.FirstAt = t
	}
	if t, ok := parseRFC3339(d["last_at"]); ok {
		n.LastAt = t
	}
	if _, ok := d["at"]; !ok {
		d["at"] = rfc3339(now)
	}
	h := a.readyHandle() // after Start: a.emitter is set
	if h == nil {
		return
	}
	h.events.remember(n)
	e := a.emitter
	if e == nil {
		return
	}
	if e.notifier != nil {
		safe := maps.Clone(d)
		delete(safe, "provider")
		delete(safe, "count")
		e.notifier.Notify(notify.Event{Name: name, Provider: provider, Count: n.Count, FirstAt: n.FirstAt, LastAt: n.LastAt, Data: safe})
	}
	select {
	case e.queue <- emitted{name, d}:
	default:
		e.dropped.allow(name)
	}
}

// remember adds n to the recent notifications.
func (s *eventState) remember(n adminapi.Notification) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recent = append(s.recent, n)
	if len(s.recent) > recentNotifications {
		s.recent = slices.Delete(s.recent, 0, len(s.recent)-recentNotifications)
	}
}

// recentNotifications is the notifications part of /pingback/status: the
// last events emitted in this process, newest first; [] when none.
func (a *App) recentNotifications() []adminapi.Notification {
	out := []adminapi.Notification{}
	h := a.readyHandle()
	if h == nil {
		return out
	}
	h.events.mu.Lock()
	defer h.events.mu.Unlock()
	for i := len(h.events.recent) - 1; i >= 0; i-- {
		out = append(out, h.events.recent[i])
	}
	return out
}

// startEvents starts the app's emitter (and notifier, with notify's url),
// resolving notify's secret; Start calls it before it opens the store.
func (a *App) startEvents() error {
	e := &eventEmitter{
		queue:   make(chan emitted, eventQueueSize),
		stop:    make(chan struct{}),
		dropped: newThrottledLog(1, 32, "events dropped: the events app's handlers are slower than the events come"),
	}
	n, err := a.newNotifier()
	if err != nil {
		return err
	}
	e.notifier = n
	a.emitter = e
	if n != nil {
		n.Start()
	}
	e.done.Add(2)
	go a.emitLoop(e)
	go a.watchLoop(e)
	return nil
}

// stopEvents stops the emitter and notifier and waits for their
// goroutines; events still queued are dropped. Cleanup calls it.
func (a *App) stopEvents() {
	e := a.emitter
	if e == nil {
		return
	}
	close(e.stop)
	e.done.Wait()
	if e.notifier != nil {
		e.notifier.Stop()
	}
}

// emitLoop hands queued events to the events app.
func (a *App) emitLoop(e *eventEmitter) {
	defer e.done.Done()
	for {
		select {
		case <-e.stop:
			return
		case ev := <-e.queue:
			if a.eventsApp != nil {
				a.eventsApp.Emit(a.ctx, ev.name, ev.data)
			}
		}
	}
}

// watchLoop looks, every second while the app owns the loops, for what is
// noticed by looking: the store's availability, routes failing for
// failing_after, quarantined pingbacks to summarise.
func (a *App) watchLoop(e *eventEmitter) {
	defer e.done.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		h := a.readyHandle()
		if h == nil || !h.owns(a) {
			continue
		}
		now := a.now().UTC()
		a.recovering("events watch", func() {
			a.checkStoreAvailability(h)
			a.checkRoutesFailing(h, now)
			a.summariseQuarantined(h, now)
			e.dropped.flush(a.logger, zap.WarnLevel, "event")
		})
	}
}

// checkStoreAvailability emits pingback_store_unavailable and
// pingback_store_available when the store's availability changes (and
// unavailable if it is so when first seen).
func (a *App) checkStoreAvailability(h *storeHandle) {
	up := h.store.Available()
	s := &h.events
	s.mu.Lock()
	changed := s.storeKnown && s.storeUp != up || !s.storeKnown && !up
	s.storeKnown, s.storeUp = true, up
	s.mu.Unlock()
	if !changed {
		return
	}
	name := EventStoreAvailable
	if !up {
		name = EventStoreUnavailable
	}
	a.emitEvent(name, "", map[string]any{"store": a.storeKind()})
}

// storeKind is the store module's name: badger or postgres.
func (a *App) storeKind() string {
	if _, ok := a.storeMod.(*PostgresStore); ok {
		return "postgres"
	}
	return "badger"
}

// noteQuarantinedEvent counts a quarantined pingback of provider for its
// next pingback_results_quarantined summary (summariseQuarantined); it
// only takes a lock.
func (a *App) noteQuarantinedEvent(provider string) {
	h := a.readyHandle()
	if h == nil {
		return
	}
	now := a.now().UTC()
	s := &h.events
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quarantined == nil {
		s.quarantined = make(map[string]*adminapi.Notification)
	}
	n := s.quarantined[provider]
	if n == nil {
		n = &adminapi.Notification{Event: EventResultsQuarantined, Provider: provider, FirstAt: now}
		s.quarantined[provider] = n
	}
	n.Count++
	n.LastAt = now
}

// summariseQuarantined emits one pingback_results_quarantined per
// provider with pingbacks quarantined since its last one: a second after
// the first of them (so a burst is one event), and at most once per
// notify interval per provider.
func (a *App) summariseQuarantined(h *storeHandle, now time.Time) {
	every := a.notifyInterval()
	s := &h.events
	var due []adminapi.Notification
	s.mu.Lock()
	for p, n := range s.quarantined {
		if now.Sub(n.FirstAt) < quarantineSummaryGathered || now.Sub(s.quarantineSent[p]) < every {
			continue
		}
		due = append(due, *n)
		delete(s.quarantined, p)
		if s.quarantineSent == nil {
			s.quarantineSent = make(map[string]time.Time)
		}
		s.quarantineSent[p] = now
	}
	s.mu.Unlock()
	for _, n := range due {
		a.emitEvent(EventResultsQuarantined, n.Provider, map[string]any{
			"count": n.Count, "first_at": rfc3339(n.FirstAt), "last_at": rfc3339(n.LastAt),
		})
	}
}

// noteAccountEvent emits name (pingback_api_key_rejected or
// pingback_account_out_of_budget) for acct, named by its account id.
func (a *App) noteAccountEvent(name string, acct store.Account) {
	a.emitEvent(name, acct.Provider, map[string]any{"account": acct.ID})
}

// undelivered reports whether a result in state is not yet delivered, as
// pingback_results_expiring counts it (quarantined ones are suspected
// forgeries: not counted).
func undelivered(state store.State) bool {
	switch state {
	case store.StateQueued, store.StateFailed, store.StateForwarding, store.StateParked, store.StateRejected:
		return true
	}
	return false
}

// checkExpiring emits one pingback_results_expiring per provider for the
// undelivered results that entered their last hour of retention since the
// last check: each result is counted once in this process (the window of
// received times already looked at is remembered), not every round. A
// round looks at expiringScanMax records at most and goes on from there
// in the next. The housekeeping of the replay loop calls it.
func (a *App) checkExpiring(st store.Store) {
	s := &a.handle.events
	now := a.now().UTC()
	s.mu.Lock()
	q := store.ListQuery{ReceivedAfter: s.expiringFrom, ReceivedBefore: s.expiringTo, After: s.expiringCursor}
	scanMax := cmp.Or(s.scanMax, expiringScanMax)
	s.mu.Unlock()
	q.Limit = min(1000, scanMax)
	if q.After == nil {
		// A new window: from where the last one ended (at start, from
		// the retention's start: older results are being swept) to an
		// hour of retention left.
		q.ReceivedAfter = now.Add(-time.Duration(a.Retention))
		if q.ReceivedBefore.After(q.ReceivedAfter) {
			q.ReceivedAfter = q.ReceivedBefore
		}
		q.ReceivedBefore = now.Add(expiringNotice - time.Duration(a.Retention))
		if !q.ReceivedBefore.After(q.ReceivedAfter) {
			return
		}
	}
	counts := map[string]int{}
	first := map[string]time.Time{}
	var next *store.Position
	for scanned := 0; ; {
		page, err := st.ListPage(a.loopCtx, q)
		if err != nil {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrClosed) {
				a.logger.Warn("looking for results near the end of their retention", zap.Error(err))
			}
			return // looked at again next round
		}
		for _, rec := range page.Records {
			if !undelivered(rec.State) {
				continue
			}
			counts[rec.Provider]++
			if f, ok := first[rec.Provider]; !ok || rec.ExpiresAt.Before(f) {
				first[rec.Provider] = rec.ExpiresAt
			}
		}
		scanned += len(page.Records)
		if page.Next == nil {
			break
		}
		q.After = page.Next
		if scanned >= scanMax {
			next = page.Next
			break
		}
	}
	s.mu.Lock()
	s.expiringFrom, s.expiringTo, s.expiringCursor = q.ReceivedAfter, q.ReceivedBefore, next
	s.mu.Unlock()
	for _, p := range slices.Sorted(maps.Keys(counts)) {
		a.emitEvent(EventResultsExpiring, p, map[string]any{
			"count": counts[p], "first_expires_at": rfc3339(first[p]),
			"retention_seconds": int64(time.Duration(a.Retention).Seconds()),
		})
	}
}

// rfc3339 formats t in UTC, to the second.
func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// parseRFC3339 reads v, an RFC 3339 string.
func parseRFC3339(v any) (time.Time, bool) {
	s, ok := v.(string)
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, s)
	return t, err == nil
}
