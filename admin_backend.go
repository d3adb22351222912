package pingback

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-pingback/pingback/internal/admin"
	"github.com/caddy-pingback/pingback/internal/store"
)

// The methods of App that package admin's routes call (admin.Backend):
// the running config's app answers the admin API and the console.

// Ready reports whether Start has run and opened the store.
func (a *App) Ready() bool { return a.readyHandle() != nil }

// Store returns the open store, waiting up to a second for Start to open
// it; errStoreUnavailable ("store not open") when there is none.
func (a *App) Store() (store.Store, error) {
	st := a.store(time.Second)
	if st == nil {
		return nil, errStoreUnavailable
	}
	return st, nil
}

// Now is the app's clock (the replay loop's).
func (a *App) Now() time.Time { return a.now() }

// Logger is the app's logger (named pingback).
func (a *App) Logger() *zap.Logger { return a.logger }

// ReplayResult replays the stored result of key now, by hand
// (App.redrive with store.SourceManual), and returns the record after the
// attempt. A result that is delivered (without force), in flight,
// quarantined, whose payload was erased or of a paused provider is an
// admin.Conflict; no open store an admin.Unavailable.
func (a *App) ReplayResult(ctx context.Context, key store.Key, force bool) (*store.Record, error) {
	rec, err := a.redrive(ctx, key, force, store.SourceManual)
	return rec, adminError(err, errDelivered, errInFlight, errQuarantined, errPayloadErased, errProviderPaused)
}

// ReleaseResult delivers the quarantined result of key now, by hand
// (App.release). A result that is not quarantined, whose payload was
// erased or of a paused provider is an admin.Conflict; no open store an
// admin.Unavailable.
func (a *App) ReleaseResult(ctx context.Context, key store.Key) (*store.Record, error) {
	rec, err := a.release(ctx, key)
	return rec, adminError(err, errNotQuarantined, errPayloadErased, errProviderPaused)
}

// adminError marks err for the admin routes: an admin.Conflict if it is
// one of conflicts, an admin.Unavailable if it is errStoreUnavailable,
// else err as it is.
func adminError(err error, conflicts ...error) error {
	if err == nil {
		return nil
	}
	for _, c := range conflicts {
		if errors.Is(err, c) {
			return admin.Conflict{Err: err}
		}
	}
	if errors.Is(err, errStoreUnavailable) {
		return admin.Unavailable{Err: err}
	}
	return err
}

// PurgedResults reads again the quarantine's bytes of provider ("" for
// every provider) in st after a purge (quarantinePurged).
func (a *App) PurgedResults(ctx context.Context, st store.Store, provider string) {
	quarantinePurged(ctx, st, provider)
}

// PublicRecord is rec as an admin answer shows it (publicRecord), with
// Held set while its provider is paused (App.showHeld).
func (a *App) PublicRecord(rec *store.Record) *store.Record { return a.showHeld(publicRecord(rec)) }

// PublicTask is t as an admin answer shows it (publicTask).
func (a *App) PublicTask(t *store.Task) *store.Task { return publicTask(t) }
