package pingback

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// housekeepingEvery is the period of the replay loop's slow chores: the
// expiry sweep and the aggregate log lines.
const housekeepingEvery = time.Minute

// replayLoop claims and forwards due records while this app owns the
// store's loops: at start (a forward cut by a crash is replayed at once),
// every tick, and whenever a forward ends or a polled result is queued.
//
// The dead-letter queue is the set of records in state failed (retried
// here with backoff), rejected or parked (kept, visible, not retried), plus
// records whose forward was cut (a crash, a reload: replayed here at once)
// and polled results waiting for their first forward (queued). Every
// replay reaches the app through deliver and dispatch: the same server,
// route and next handler as a live callback.
func (a *App) replayLoop() {
	defer close(a.loopDone)
	tick := min(max(time.Duration(a.Replay.BackoffMin)/4, 20*time.Millisecond), time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	chores := time.NewTicker(housekeepingEvery)
	defer chores.Stop()
	for {
		if a.handle.owns(a) {
			a.recovering("replay loop", func() {
				a.metrics.storeAvailable.Set(boolGauge(a.handle.store.Available()))
				a.replayDue()
				a.loopRan("replay")
				a.historyRound()
			})
		}
		select {
		case <-a.stop:
			return
		case <-t.C:
		case <-a.handle.kick:
		case <-chores.C:
			if a.handle.owns(a) {
				a.recovering("replay loop housekeeping", a.housekeeping)
			}
		}
	}
}

// recovering runs one round of a loop; a panic is logged and the loop goes
// on with its next round.
func (a *App) recovering(what string, round func()) {
	defer func() {
		if err := recover(); err != nil {
			a.logger.Error(what+" panicked; going on with the next round", zap.Any("error", err), zap.ByteString("stack", debug.Stack()))
		}
	}()
	round()
}

// replayDue claims as many due records as there are free forward slots,
// in one atomic claim made after the slots are known to be free (so no
// claimed record waits, and no attempt is counted without a forward), and
// forwards each in its own goroutine.
//
// The claim is fair: half the replay concurrency (rounded up) goes first
// to due records with at most store.FewFailures failures, so that a
// backlog of records that failed many times cannot starve one that failed
// once (a live pingback the app refused during a drain). A route that
// asked for less traffic gets only the replays its flow control allows
// ([routeFlows]). Once the config is stopping ([App.beginCut]) it claims
// nothing: a forward started then would only be cut, burning an attempt.
func (a *App) replayDue() {
	st := a.handle.store
	a.slotMu.Lock() // no bulk replay takes a slot between the count and the claim's
	defer a.slotMu.Unlock()
	now := a.now().UTC()
	a.setRouteGauges(a.handle, now)
	free := cap(a.inflight) - len(a.inflight)
	if a.isStopping() {
		return // the config is stopping: a forward started now would only be cut
	}
	if free <= 0 || !st.Available() || a.handle.outcomesWaiting.Load() > 0 {
		return // outcomes waiting for the store are recorded first
	}
	room := a.handle.flows.room(now)
	limit := a.handle.flows.claimLimit(free, room, now)
	if limit <= 0 {
		return // every route being drained is paused or at its limit
	}
	allPaused, skip := a.handle.claimSkips()
	if allPaused {
		return // every provider is paused: their results are held
	}
	claimed, err := st.Claim(a.loopCtx, store.ClaimRequest{
		Now: now, Limit: limit, Lease: a.leaseFor(st), DecideRecord: decide(now, a.maxAgeOf),
		Reserved: (a.Replay.Concurrency + 1) / 2,
		Route:    routeOfRecord, Room: room,
		SkipProviders: skip, // paused providers' results stay held
	})
	if err != nil {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrClosed) {
			a.logger.Error("claiming due results for replay", zap.Error(err))
		}
		return
	}
	for _, rec := range claimed {
		if rec.State != store.StateForwarding {
			if rec.State == store.StateParked {
				a.noteParked(rec.Key(), rec.Delivery)
			}
			if rec.State == store.StateExpired {
				a.noteMaxAgeExpired(rec)
			}
			continue
		}
		if !a.handle.track() {
			return // the store is closing: the leases lapse with it
		}
		a.inflight <- struct{}{} // never blocks: slots are taken under slotMu
		route := routeOfRecord(rec)
		a.handle.flows.start(route, serverProvider{rec.Server, rec.Provider}, now)
		go func() {
			defer func() {
				a.handle.flows.done(route)
				a.releaseSlot()
				a.handle.untrack()
				a.handle.wake()
			}()
			// The slot frees when the forward ends; its outcome is
			// recorded meanwhile and shares the commit of the next claim.
			a.deliverStored(st, rec, sourceOf(rec), true)
		}()
	}
}

// deliverStored forwards a claimed record through the server and route it
// came in on and records the outcome (with background, after it returns).
func (a *App) deliverStored(st store.Store, rec *store.Record, src store.Source, background bool) outcome {
	return a.deliver(context.Background(), delivery{
		st:         st,
		rec:        rec,
		src:        src,
		background: background,
		route:      routeOf(rec.Request.Host, rec.Request.URI),
		send: func(ctx context.Context) outcome {
			return a.dispatch(ctx, rec, src, rec.Attempts)
		},
	})
}

// housekeeping runs the replay loop's slow chores.
func (a *App) housekeeping() {
	st := a.handle.store
	a.handle.failures.flush(a.logger, zap.WarnLevel, "route")
	a.handle.storeErrors.flush(a.logger, zap.ErrorLevel, "provider")
	a.handle.quarantined.flush(a.logger, zap.WarnLevel, "provider")
	a.handle.confirmsDropped.flush(a.logger, zap.WarnLevel, "provider")
	a.handle.expired.flush(a.logger, zap.WarnLevel, "provider")
	a.expireUndelivered(st)
	a.pruneHistory(st)
	a.erasePayloads(st, a.now().UTC())
	a.checkExpiring(st)
}

// expireUndelivered counts and logs the results whose retention ended
// before they were delivered: expiry is never silent.
func (a *App) expireUndelivered(st store.Store) {
	for {
		// What a failed call returns was forgotten all the same (an
		// earlier transaction of it): it is counted before the error.
		gone, err := st.Expire(a.loopCtx, a.now().UTC(), 1000)
		for _, e := range gone {
			a.metrics.expiredUndelivered.WithLabelValues(e.Key.Provider, string(e.State)).Inc()
			if e.State == store.StateQuarantined {
				a.quarantineChanged(st, e.Key.Provider)
				continue // counted; a forgery flood would otherwise flood the log
			}
			if e.State == store.StateExpired {
				continue // counted; logged when it expired for max_age
			}
			a.logger.Warn("result expired at retention without having been delivered",
				zap.String("key", e.Key.String()), zap.String("state", string(e.State)))
		}
		if err != nil {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrClosed) {
				a.logger.Error("sweeping expired results", zap.Error(err))
			}
			return
		}
		if len(gone) < 1000 {
			return
		}
	}
}

// noteParked counts and logs a result that was just parked.
func (a *App) noteParked(key store.Key, d store.Delivery) {
	a.metrics.parked.WithLabelValues(key.Provider).Inc()
	a.handle.noteParked()
	a.logger.Warn("result parked; replay it by hand (POST /pingback/records/<provider>/<id>/replay on the admin endpoint)",
		zap.String("key", key.String()), zap.Int("attempts", d.Attempts), zap.Int("failures", d.Failures),
		zap.String("last_error", d.LastError))
	a.emitEvent(EventResultParked, key.Provider, map[string]any{"attempts": d.Attempts, "failures": d.Failures})
}

// errInFlight means a record's forward is under way (its lease holds).
var errInFlight = errors.New("a forward of this result is in flight")

// errDelivered means a replay by hand was refused: the app already has
// the result.
var errDelivered = errors.New("already delivered to the app; replay with force=true to deliver it again")

// redrive replays one record now, by hand, whatever its state (parked,
// rejected, failed; delivered only with force), through the same path as the replay
// loop, and returns the record after the attempt. A retryable failure of a
// record past max_attempts parks it again. It fails with errInFlight while
// a forward is under way, and store.ErrNotFound for an unknown key.
//
// A delivered result is replayed only with force (the app already has it):
// without, redrive leaves it as it is and returns errDelivered, decided in
// the claim's own transaction. One whose payload was erased (keep_payload)
// is never replayed: errPayloadErased.
//
// src is the history's source of the attempt: store.SourceManual, or
// store.SourceBulk for a bulk replay job (the app sees replay either way).
func (a *App) redrive(ctx context.Context, key store.Key, force bool, src store.Source) (*store.Record, error) {
	st := a.store(time.Second)
	if st == nil {
		return nil, errStoreUnavailable
	}
	// Paused: the record is left as it is, and refused once what it is
	// has been answered (unknown, in flight, erased, quarantined,
	// delivered without force come first: a resume would not change them).
	paused := a.refusePaused(key.Provider)
	now := a.now().UTC()
	claimed, err := st.Claim(ctx, store.ClaimRequest{
		Now: now, Limit: 1, Keys: []store.Key{key}, Lease: a.leaseFor(st),
		DecideRecord: func(rec *store.Record, d *store.Delivery, lapsed bool) {
			if (d.State == store.StateDelivered && !force) || d.State == store.StateQuarantined || rec.PayloadErased || paused != nil {
				// Quarantined: only a release (App.release) delivers it;
				// erased: nothing is left to deliver.
				return
			}
			if lapsed {
				endInterrupted(d, now)
				d.Interrupts++
			}
			d.State, d.UpdatedAt = store.StateForwarding, now
			d.ExpiredReason = "" // an expired result replayed by hand
			d.Attempts++
			d.StartAttempt(src, now)
		},
	})
	if err != nil {
		return nil, err
	}
	if len(claimed) == 0 {
		if _, err := st.Get(ctx, key); err != nil {
			return nil, err
		}
		return nil, errInFlight
	}
	rec := claimed[0]
	if rec.PayloadErased {
		return rec, errPayloadErased
	}
	if rec.State == store.StateQuarantined {
		return rec, errQuarantined
	}
	if rec.State == store.StateDelivered && !force {
		return rec, errDelivered
	}
	if paused != nil {
		return rec, paused
	}
	if rec.State != store.StateForwarding {
		return rec, errDelivered
	}
	h := a.readyHandle()
	if h == nil || !h.track() {
		return nil, errStoreUnavailable
	}
	out := a.deliverStored(st, rec, store.SourceReplay, false)
	h.untrack()
	a.logger.Info("result replayed by hand", zap.String("key", key.String()),
		zap.Int("attempt", rec.Attempts), zap.String("outcome", out.class.String()))
	return st.Get(ctx, key)
}

// decide is the replay loop's claim policy (store.ClaimRequest.DecideRecord):
// a due record, or one whose forward was cut, is leased for one more
// attempt, unless its forwards were cut maxInterrupts times in a row. The
// attempt starts in the history with the source the app is sent
// (sourceFor): correction, poll or callback for a record's first forward
// (a polled result, or a pingback that waited for its confirmation or its
// task's commit), else replay. A replay or polled delivery of a result
// older than its provider's maxAge is not claimed but expired
// (expireIfTooOld). It is pure.
func decide(now time.Time, maxAge func(provider string) time.Duration) func(rec *store.Record, d *store.Delivery, lapsed bool) {
	return func(rec *store.Record, d *store.Delivery, lapsed bool) {
		d.UpdatedAt = now
		if lapsed {
			endInterrupted(d, now)
			d.Interrupts++
			if d.Interrupts >= maxInterrupts {
				park(d, interruptsReason(d))
				return
			}
		}
		if expireIfTooOld(rec, d, maxAge(rec.Provider), now) {
			return
		}
		d.State = store.StateForwarding
		d.Attempts++
		d.StartAttempt(sourceFor(rec, d.Attempts), now)
	}
}

// endInterrupted ends, in the history, the attempt whose lease lapsed
// (the store set LastError to why).
func endInterrupted(d *store.Delivery, now time.Time) {
	d.EndAttempt(d.Attempts, now, 0, interrupted.String(), d.LastError)
}

// park parks d, saying why in its last error.
func park(d *store.Delivery, why string) {
	d.State, d.DueAt, d.Lease = store.StateParked, time.Time{}, store.Lease{}
	d.LastError = why
}

func interruptsReason(d *store.Delivery) string {
	return fmt.Sprintf("parked: %d forwards in a row were interrupted before they ended (last: %s); does this result crash Caddy?", d.Interrupts, d.LastError)
}

// sourceOf is the X-Pingback-Source of a claimed record's forward, the
// one its history names (decide): sourceFor its attempt.
func sourceOf(rec *store.Record) store.Source { return sourceFor(rec, rec.Attempts) }

// sourceFor is the source of forward number attempt of rec by the replay
// loop: correction for a corrected result; poll for the first forward of
// a polled result, callback for the first forward of a pingback that
// waited (for its confirmation, or for its task's commit); replay for
// every other.
func sourceFor(rec *store.Record, attempt int) store.Source {
	switch {
	case rec.Correction:
		return store.SourceCorrection
	case attempt == 1 && (rec.Source == store.SourcePoll || rec.Source == store.SourceCallback):
		return rec.Source
	}
	return store.SourceReplay
}
