package pingback

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/admin"
	"github.com/caddy-pingback/pingback/internal/store"
)

// pauseRefresh is how often the loop owner reads the pauses from the
// store again: a pause made through another instance of a shared store
// holds here within it (plus one read).
const pauseRefresh = 250 * time.Millisecond

// pausedGauge is caddy_pingback_paused{provider}: 1 while the provider
// ("*": every provider) is paused, 0 once resumed.
var pausedGauge = newGaugeVec("paused", []string{"provider"},
	"1 while the deliveries of the provider are paused (provider \"*\": every provider), 0 once resumed.")

// pauseSet is one immutable reading of the pauses.
type pauseSet struct {
	byProvider map[string]store.Pause
	all        bool     // "*" is paused
	skip       []string // the providers paused on their own, sorted (ClaimRequest.SkipProviders)
}

// pauseView is the pauses as this process last read them: what the hot
// path reads, one atomic load.
type pauseView struct{ cur atomic.Pointer[pauseSet] }

// load returns the current set; an empty one before the first read.
func (v *pauseView) load() *pauseSet {
	if s := v.cur.Load(); s != nil {
		return s
	}
	return &pauseSet{}
}

// pauseOf returns the pause that holds provider: its own, else that of
// every provider.
func (s *pauseSet) pauseOf(provider string) (store.Pause, bool) {
	if p, ok := s.byProvider[provider]; ok {
		return p, true
	}
	p, ok := s.byProvider[store.PauseAll]
	return p, ok
}

// list returns the pauses ordered by provider.
func (s *pauseSet) list() []store.Pause {
	out := make([]store.Pause, 0, len(s.byProvider))
	for _, k := range slices.Sorted(maps.Keys(s.byProvider)) {
		out = append(out, s.byProvider[k])
	}
	return out
}

// pauseState is an App's own part of pausing: the providers its config
// names and the end of its pause loop.
type pauseState struct {
	mu    sync.Mutex
	named map[string]bool
	done  chan struct{} // closed when the pause loop has returned
	// failing is set while the loop's reads fail (one log line per
	// outage, not four a second); only the pause loop uses it.
	failing bool
}

// noteProviderNamed records that the config has a pingback handler or a
// pingback_track for provider: a provider that can be paused.
func (a *App) noteProviderNamed(provider string) {
	a.pause.mu.Lock()
	defer a.pause.mu.Unlock()
	if a.pause.named == nil {
		a.pause.named = map[string]bool{}
	}
	a.pause.named[provider] = true
}

// providerNamed reports whether the config names provider: a pingback
// handler or pingback_track for it, or its block in the global option.
func (a *App) providerNamed(provider string) bool {
	a.pause.mu.Lock()
	defer a.pause.mu.Unlock()
	_, inBlock := a.Providers[provider]
	return a.pause.named[provider] || inBlock
}

// pausedBy returns the pause that holds provider's deliveries now, if
// any (the view this process last read).
func (a *App) pausedBy(provider string) (store.Pause, bool) {
	h := a.readyHandle()
	if h == nil {
		return store.Pause{}, false
	}
	return h.pauses.load().pauseOf(provider)
}

// errProviderPaused is the sentinel of a *pausedError.
var errProviderPaused = errors.New("provider paused")

// pausedError refuses a forward by hand of a result whose provider is
// paused (admin: 409).
type pausedError struct{ p store.Pause }

func (e *pausedError) Error() string {
	who := "provider " + e.p.Provider
	if e.p.Provider == store.PauseAll {
		who = "every provider"
	}
	return fmt.Sprintf("%s is paused (since %s): nothing of it is delivered until it is resumed (DELETE /pingback/pauses/%s)",
		who, e.p.Since.UTC().Format(time.RFC3339), e.p.Provider)
}

func (e *pausedError) Is(target error) bool { return target == errProviderPaused }

// refusePaused returns a *pausedError if provider is paused: the check of
// every forward by hand (App.redrive, App.release).
func (a *App) refusePaused(provider string) error {
	if p, ok := a.pausedBy(provider); ok {
		return &pausedError{p}
	}
	return nil
}

// claimSkips is how the replay loop's claim honours the pauses: all
// reports that every provider is paused (claim nothing); skip lists the
// providers paused on their own.
func (h *storeHandle) claimSkips() (all bool, skip []string) {
	s := h.pauses.load()
	return s.all, s.skip
}

// startPauses reads the pauses before the app serves (a pause survives
// reloads and restarts) and starts the pause loop.
func (a *App) startPauses() {
	a.pause.done = make(chan struct{})
	ctx, cancel := context.WithTimeout(a.loopCtx, 5*time.Second)
	defer cancel()
	if err := a.refreshPauses(ctx); err != nil {
		a.logger.Error("reading the pauses of deliveries at start; retrying every 250ms", zap.Error(err))
	}
	go a.pauseLoop()
}

// pauseLoop reads the pauses again every pauseRefresh while this app owns
// the store's loops, and ends the pauses whose until has come.
func (a *App) pauseLoop() {
	defer close(a.pause.done)
	t := time.NewTicker(pauseRefresh)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		if !a.handle.owns(a) {
			continue
		}
		a.recovering("pause loop", func() {
			if err := a.refreshPauses(a.loopCtx); err != nil {
				if !a.pause.failing && !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrClosed) {
					a.logger.Warn("reading the pauses of deliveries failed; the last ones read stay in force until a read succeeds", zap.Error(err))
					a.pause.failing = true
				}
				return
			}
			if a.pause.failing {
				a.pause.failing = false
				a.logger.Info("reading the pauses of deliveries again")
			}
			a.resumeDue()
		})
	}
}

// refreshPauses reads the pauses from the store into the view and moves
// the gauge; a provider resumed on another instance wakes the replay loop.
func (a *App) refreshPauses(ctx context.Context) error {
	ps, err := a.handle.store.ListPauses(ctx)
	if err != nil {
		return err
	}
	a.setPauses(ps)
	return nil
}

// setPauses makes ps the view.
func (a *App) setPauses(ps []store.Pause) {
	next := &pauseSet{byProvider: make(map[string]store.Pause, len(ps))}
	for _, p := range ps {
		next.byProvider[p.Provider] = p
		if p.Provider == store.PauseAll {
			next.all = true
		} else {
			next.skip = append(next.skip, p.Provider)
		}
	}
	slices.Sort(next.skip)
	prev := a.handle.pauses.cur.Swap(next)
	resumed := false
	if prev != nil {
		for name := range prev.byProvider {
			if _, ok := next.byProvider[name]; !ok {
				pausedGauge.WithLabelValues(name).Set(0)
				resumed = true
			}
		}
	}
	for name := range next.byProvider {
		pausedGauge.WithLabelValues(name).Set(1)
	}
	if resumed {
		a.handle.wake()
	}
}

// resumeDue ends the pauses whose until has come: the first instance
// whose loop sees one due deletes it (a timer's resume, logged by timer).
func (a *App) resumeDue() {
	now := a.now().UTC()
	ended := false
	for _, p := range a.handle.pauses.load().list() {
		if !p.Due(now) {
			continue
		}
		gone, err := a.handle.store.DeletePause(a.loopCtx, p.Provider, now)
		switch {
		case errors.Is(err, store.ErrNotFound):
			// Another instance ended it, or it was put again with a later until.
		case err != nil:
			a.logger.Warn("ending a pause whose until has come", zap.String("provider", p.Provider), zap.Error(err))
		default:
			a.pauseChanged(false, gone, "timer")
			ended = true
		}
	}
	if ended {
		_ = a.refreshPauses(a.loopCtx) // on error, the next round reads them
	}
}

// pauseChanged writes the log line of a pause (paused true) or a resume
// of p, made by by (api, cli, console or timer).
func (a *App) pauseChanged(paused bool, p store.Pause, by string) {
	var until any
	if !p.Until.IsZero() {
		until = p.Until.UTC().Format(time.RFC3339)
	}
	fields := []zap.Field{zap.String("provider", p.Provider), zap.String("reason", p.Reason),
		zap.Any("until", until), zap.String("by", by)}
	data := map[string]any{"reason": p.Reason, "until": until, "by": by}
	if paused {
		a.logger.Warn("deliveries paused: results are received and stored, and held until resumed", fields...)
		a.emitEvent(EventProviderPaused, p.Provider, data)
		return
	}
	a.logger.Info("deliveries resumed: held results are delivered through the replay loop",
		append(fields, zap.String("since", p.Since.UTC().Format(time.RFC3339)))...)
	data["since"] = p.Since.UTC().Format(time.RFC3339)
	a.emitEvent(EventProviderResumed, p.Provider, data)
}

// PutPause pauses the deliveries of p.Provider (admin.Backend): stored,
// then in force in this process at once (on another instance of a shared
// store within a second). A provider the config does not name is a 400.
func (a *App) PutPause(ctx context.Context, p store.Pause) (store.Pause, error) {
	if p.Provider != store.PauseAll && !a.providerNamed(p.Provider) {
		return store.Pause{}, admin.BadInput("unknown provider %q: no pingback handler, pingback_track or provider block of this config names it", p.Provider)
	}
	h := a.readyHandle()
	if h == nil {
		return store.Pause{}, admin.Unavailable{Err: errStoreUnavailable}
	}
	got, err := h.store.PutPause(ctx, p)
	if err != nil {
		return store.Pause{}, err
	}
	a.pauseChanged(true, got, p.By)
	if err := a.refreshPauses(ctx); err != nil {
		a.setPauses(append(h.pauses.load().list(), got)) // in force here at once all the same
	}
	return got, nil
}

// DeletePause resumes provider (admin.Backend): the pause is deleted, and
// the replay loop delivers the held results. store.ErrNotFound when it
// has no pause of its own.
func (a *App) DeletePause(ctx context.Context, provider, by string) (store.Pause, error) {
	h := a.readyHandle()
	if h == nil {
		return store.Pause{}, admin.Unavailable{Err: errStoreUnavailable}
	}
	gone, err := h.store.DeletePause(ctx, provider, time.Time{})
	if err != nil {
		return store.Pause{}, err
	}
	a.pauseChanged(false, gone, by)
	if err := a.refreshPauses(ctx); err != nil {
		a.setPauses(slices.DeleteFunc(h.pauses.load().list(), func(p store.Pause) bool { return p.Provider == provider }))
	}
	return gone, nil
}

// ListPauses returns the pauses in force as this process last read them
// (admin.Backend), by provider.
func (a *App) ListPauses(context.Context) ([]store.Pause, error) {
	h := a.readyHandle()
	if h == nil {
		return nil, admin.Unavailable{Err: errStoreUnavailable}
	}
	return h.pauses.load().list(), nil
}

// pauseList is the pauses of /pingback/status.
func (a *App) pauseList() []store.Pause {
	ps, _ := a.ListPauses(context.Background())
	return ps
}

// showHeld is rec with Held set when it is queued or failed while its
// provider is paused (a copy then): how the admin API shows a record.
func (a *App) showHeld(rec *store.Record) *store.Record {
	if rec == nil || (rec.State != store.StateQueued && rec.State != store.StateFailed) {
		return rec
	}
	if _, ok := a.pausedBy(rec.Provider); !ok {
		return rec
	}
	cp := *rec
	cp.Held = true
	return &cp
}

// holdIfPaused makes a live pingback that is not quarantined a held one
// while its provider is paused: stored queued, due at once, with no
// attempt (the replay loop claims it once the provider is resumed, as
// the callback it is). Called once judge has decided.
func (x *exchange) holdIfPaused() {
	if x.v.why != "" {
		return
	}
	if _, ok := x.h.app.pausedBy(x.h.Provider); !ok {
		return
	}
	x.held = true
	x.rec.Delivery = store.Delivery{State: store.StateQueued, DueAt: x.now, UpdatedAt: x.now}
}

// heldStored answers the provider 200 for a held pingback that is
// stored, and reports whether it did: it is delivered once its provider
// is resumed. One the store could not take is forwarded all the same,
// without durability, exactly as when its provider is not paused (the
// provider is answered 200 only if the app took it, else 503), with an
// error line: a pause never changes what the provider is answered, and a
// result neither stored nor forwarded could be lost for good, since
// providers call a pingback URL once.
func (x *exchange) heldStored() bool {
	if x.err == nil {
		x.reply.send(200, "OK")
		return true
	}
	x.h.logger.Error("result NOT stored while its provider is paused: forwarded all the same, without durability (a pause never changes what the provider is answered)",
		zap.String("provider", x.h.Provider), zap.String("id", x.cb.id), zap.Error(x.err))
	return false
}
