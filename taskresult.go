package pingback

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/providerclient"
	"github.com/caddy-pingback/pingback/internal/store"
)

// pollJSONTasks asks getTaskResult for each due createTask task, one task
// per request, within the provider's rate limit and budget (takePoll, as
// res.php: the store's if it is shared), honouring the provider's per-task
// limits: at most MaxResultCalls calls per task counting the app's own
// passed-through calls (CapMonster: 120), and no poll of a task the app
// polled itself within the last interval (its answer, passed through
// pingback_track, gives the plugin the result anyway).
func (a *App) pollJSONTasks(name string, ps *providerState, pc *ProviderConfig, tasks []*store.Task, now time.Time) {
	if len(tasks) == 0 {
		return
	}
	prov, _ := lookupProvider(name)
	if pc.apiEndpoint == "" {
		for _, t := range tasks {
			a.expireTask(t, "the provider has no JSON API the plugin can poll")
		}
		return
	}
	client := &providerclient.TaskResult{Provider: prov, Endpoint: pc.apiEndpoint, Key: pc.key, HTTP: a.httpClient}
	interval := time.Duration(a.Poll.Interval)
	for _, t := range tasks {
		if !a.handle.owns(a) {
			return
		}
		if prov.MaxResultCalls > 0 && t.Polls+t.AppPolls >= prov.MaxResultCalls {
			a.logger.Warn("task reached the provider's limit of result calls; not polled again",
				zap.String("key", t.Key().String()), zap.Int("limit", prov.MaxResultCalls),
				zap.Int("polls", t.Polls), zap.Int("app_polls", t.AppPolls))
			a.expireTask(t, "the provider's limit of getTaskResult calls per task was reached")
			continue
		}
		if !t.AppPolledAt.IsZero() && now.Sub(t.AppPolledAt) < interval {
			a.reschedule(t, t.AppPolledAt.Add(interval), false)
			continue
		}
		// The same rate and budget as res.php (shared by every instance
		// when the store is: two instances never poll twice as hard).
		if ok, _, _ := a.takePoll(name, ps); !ok {
			return
		}
		ct := a.reschedule(t, now.Add(max(interval, prov.MinResultGap)), true)
		if ct == nil {
			continue
		}
		ps.mu.Lock()
		ps.polls++
		ps.mu.Unlock()
		ctx, cancel := context.WithTimeout(a.ctx, resTimeout)
		ans, err := client.Get(ctx, ct.ID)
		cancel()
		if err != nil {
			a.metrics.resphp.WithLabelValues(name, "error").Inc()
			a.backoffProvider(name, ps, now, protocol.Answer{Kind: protocol.Backoff, Code: err.Error()})
			return
		}
		a.metrics.resphp.WithLabelValues(name, "ok").Inc()
		if !a.onAnswer(name, ps, ct, ans, now) {
			return
		}
	}
}
