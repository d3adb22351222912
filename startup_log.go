package pingback

import (
	"slices"
	"time"

	"go.uber.org/zap"
)

// logPlan writes the start-up line that says what the plugin will do with
// this config: the store and its location, the providers it polls (those
// with an api_key), and the replay and poll settings in force.
func (a *App) logPlan() {
	var polled, unpolled []string
	for name, pc := range a.Providers {
		if pc != nil && pc.key != "" {
			polled = append(polled, name)
		} else {
			unpolled = append(unpolled, name)
		}
	}
	slices.Sort(polled)
	slices.Sort(unpolled)
	kind := "badger"
	if _, ok := a.storeMod.(*PostgresStore); ok {
		kind = "postgres"
	}
	r, p := a.Replay, a.Poll
	a.logger.Info("pingback plugin started",
		zap.String("store", kind), zap.String("location", a.name),
		zap.Strings("providers_polled", polled), zap.Strings("providers_not_polled_no_api_key", unpolled),
		zap.String("replay_backoff", time.Duration(r.BackoffMin).String()+" to "+time.Duration(r.BackoffMax).String()),
		zap.Int("replay_max_attempts", r.MaxAttempts), zap.Int("replay_concurrency", r.Concurrency),
		zap.Duration("forward_timeout", time.Duration(r.ForwardTimeout)),
		zap.String("poll", afterText(p)), zap.Duration("poll_interval", time.Duration(p.Interval)),
		zap.Duration("poll_give_up", time.Duration(p.GiveUp)), zap.Int("poll_batch", p.Batch), zap.Float64("poll_rate", p.Rate))
}
