package pingback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/store"
)

// Payload minimisation (keep_payload): keep_payload after a result was
// delivered, the replay loop's housekeeping erases its payload from the
// store (store.PayloadEraser), in batches, as ordinary writes. What stays
// (key, state, times, attempts, statuses) dedupes a re-delivery and
// accounts for the result; nothing of it can be delivered or answered
// again.

const (
	// eraseBatch is how many results one erasure transaction takes.
	eraseBatch = 500
	// eraseRounds bounds the batches of one housekeeping round: 20,000
	// results a minute, well over 100 pingbacks a second, without holding
	// the replay loop for long.
	eraseRounds = 40
)

// errPayloadErased is why a result whose payload was erased is not
// replayed or released: there is nothing left to deliver.
var errPayloadErased = errors.New("payload erased (keep_payload) after its delivery: nothing is left to deliver")

// validateKeepPayload checks keep_payload: more than 0 and at most
// retention (Provision defaults it to retention).
func (a *App) validateKeepPayload() error {
	if a.KeepPayload == nil {
		return nil // not provisioned: the default, retention
	}
	keep, ret := time.Duration(*a.KeepPayload), time.Duration(a.Retention)
	if keep <= 0 || keep > ret {
		return fmt.Errorf("keep_payload must be more than 0 and at most retention (%s), got %s", ret, keep)
	}
	return nil
}

// keepPayloadArg parses `keep_payload <duration>` (ranges are checked
// by validateKeepPayload).
func keepPayloadArg(d *caddyfile.Dispenser, dst **caddy.Duration) error {
	var keep caddy.Duration
	if err := durationArg(d, &keep); err != nil {
		return err
	}
	*dst = &keep
	return nil
}

// erasePayloads erases the payload of the results delivered keep_payload
// or longer before now, up to eraseRounds batches. With keep_payload at
// retention (the default) it does nothing: retention forgets a record
// before its payload would be due.
func (a *App) erasePayloads(st store.Store, now time.Time) {
	if a.KeepPayload == nil {
		return
	}
	keep := time.Duration(*a.KeepPayload)
	if keep <= 0 || keep >= time.Duration(a.Retention) {
		return
	}
	before := now.Add(-keep)
	total := 0
	for range eraseRounds {
		n, err := st.ErasePayloads(a.loopCtx, before, eraseBatch)
		total += n
		if err != nil {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, store.ErrClosed) {
				a.logger.Error("erasing the payload of delivered results", zap.Error(err))
			}
			break
		}
		if n < eraseBatch {
			break
		}
	}
	if total > 0 {
		a.logger.Debug("erased the payload of delivered results", zap.Int("results", total),
			zap.Duration("keep_payload", keep))
	}
}
