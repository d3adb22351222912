package pingback

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// expireOverdue marks expired every pending task, of any account, whose
// give_up has passed: the poller expires the tasks it polls as it scans
// them, and this finds the rest, the tasks of accounts this Caddy has no
// key for (unpollable), which no due scan returns. It runs at most once
// per poll interval, oldest tasks first, and a round costs the tasks it
// expires plus one per provider (the store's task order by submission).
func (a *App) expireOverdue(now time.Time) {
	if now.Sub(a.expiredAt) < time.Duration(a.Poll.Interval) {
		return
	}
	a.expiredAt = now
	for _, name := range protocol.Names() {
		a.expireProvider(name, now.Add(-a.providerConfig(name).giveUp))
	}
}

// expireProvider expires the pending tasks of provider submitted at or
// before cutoff, a page at a time, until the first that is younger.
func (a *App) expireProvider(name string, cutoff time.Time) {
	q := store.TaskQuery{Provider: name, State: store.TaskPending, Limit: 100}
	for a.ctx.Err() == nil {
		page, err := a.handle.store.ListTaskPage(a.ctx, q)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				a.logger.Error("scanning pending tasks for give_up", zap.String("provider", name), zap.Error(err))
			}
			return
		}
		for _, t := range page.Tasks {
			if t.SubmittedAt.After(cutoff) {
				return
			}
			why := "no result within give_up"
			if !a.taskPollable(t) {
				why = "no pingback within give_up; not polled: the task's API key is not in the provider's api_key"
			}
			a.expireTask(t, why)
		}
		if page.Next == nil {
			return
		}
		q.After = page.Next
	}
}
