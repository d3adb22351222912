package pingback

import (
	"context"
	"errors"
	"time"

	"github.com/caddy-pingback/pingback/internal/admin"
	"github.com/caddy-pingback/pingback/internal/adminapi"
	"github.com/caddy-pingback/pingback/internal/protocol"
	"github.com/caddy-pingback/pingback/internal/store"
)

// RegisterTask tracks a task registered on the admin API (POST
// /pingback/tasks): its account (registrationAccount), then
// App.trackTask, strict. A bad registration is a 400 caddy.APIError.
func (a *App) RegisterTask(ctx context.Context, reg adminapi.TaskRegistration, submitted time.Time, api protocol.API) (*store.Task, bool, error) {
	account, err := registrationAccount(a.providerConfig(reg.Provider), reg)
	if err != nil {
		return nil, false, err
	}
	task, created, err := a.trackTask(ctx, trackSpec{
		provider: reg.Provider, id: reg.ID, api: api, method: reg.Method,
		pingbackURL: reg.PingbackURL, submittedAt: submitted, account: account,
	}, true)
	var bad *badRequest
	if errors.As(err, &bad) {
		return nil, false, admin.BadInput("%s", bad.reason)
	}
	return task, created, err
}

// GiveUp is the provider's give_up (the global one for an unknown
// provider, which trackTask then refuses).
func (a *App) GiveUp(provider string) time.Duration {
	if _, err := lookupProvider(provider); err != nil {
		return time.Duration(a.Poll.GiveUp)
	}
	return a.providerConfig(provider).giveUp
}

// registrationAccount returns the account a registered task belongs to:
// the one reg names, which must be a configured key's; with none named,
// the provider's only account. A provider with several keys needs one
// named (400), since polling with another account's key cannot find the
// task.
func registrationAccount(pc *ProviderConfig, reg adminapi.TaskRegistration) (string, error) {
	if reg.Account != "" {
		if _, ok := pc.account(reg.Account); !ok {
			return "", admin.BadInput("account %q is not one of provider %s's configured api_key accounts", reg.Account, reg.Provider)
		}
		return reg.Account, nil
	}
	if len(pc.accounts) > 1 {
		return "", admin.BadInput("account is required: provider %s has %d api_key accounts (see /pingback/status)", reg.Provider, len(pc.accounts))
	}
	if acc, ok := pc.onlyAccount(); ok {
		return acc.id, nil
	}
	return "", nil // no key: trackTask refuses it (strict)
}
