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
// expires (at most expireRound, the rest in the next rounds) plus one
// read per provider (the store's task order by submission). A round ends
// early when this config stops or hands the loops over (a reload).
func (a *App) expireOverdue(now time.Time) {
	if now.Sub(a.expiredAt) < time.Duration(a.Poll.Interval) {
		return
	}
	a.expiredAt = now
	left := expireRound
	for _, name := range protocol.Names() {
		if left = a.expireProvider(name, now.Add(-a.providerConfig(name).giveUp), left); left == 0 {
			a.expiredAt = time.Time{} // more to do: the next tick goes on
			return
		}
	}
}

// expireRound is the most tasks one expireOverdue round expires.
const expireRound = 1000

// expireProvider expires up to left pending tasks of provider submitted
// at or before cutoff, a page at a time, until the first that is younger.
// It returns how many of left are still left.
func (a *App) expireProvider(name string, cutoff time.Time, left int) int {
	q := store.TaskQuery{Provider: name, State: store.TaskPending, Limit: min(100, left)}
	for left > 0 && a.loopCtx.Err() == nil && a.handle.owns(a) {
		q.Limit = min(100, left)
		page, err := a.handle.store.ListTaskPage(a.loopCtx, q)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				a.logger.Error("scanning pending tasks for give_up", zap.String("provider", name), zap.Error(err))
			}
			return left
		}
		for _, t := range page.Tasks {
			if t.SubmittedAt.After(cutoff) {
				return left
			}
			left--
			why := "no result within give_up"
			if !a.taskPollable(t) {
				why = "no pingback within give_up; not polled: the task's API key is not in the provider's api_key"
			}
			a.expireTask(t, why)
		}
		if page.Next == nil {
			return left
		}
		q.After = page.Next
	}
	return left
}
