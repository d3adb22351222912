// Package admin serves the pingback admin API (the /pingback/ routes of
// Caddy's admin endpoint) and the operator's console page, for a Backend:
// the running pingback app, which the root package's App implements. The
// wire shapes are package adminapi's.
//
// Guarantees: every route answers JSON, its errors as caddy.APIError
// ({"error": "..."} with the status the route documents); no route writes
// anything before it knows its answer, so an error is never sent after a
// partial body; while a pingback app is starting and no running config
// has an open store, every route answers 503 "starting: the store is
// opening" (State); the console's API is the admin API itself, served
// in-process by the same handlers behind the console's token and origin
// checks.
//
// Relies on: the Backend's methods being safe for concurrent use; the
// lookup of the running Backend (caddy.ActiveContext's app during a reload)
// and the State of the process, both given by the root package, which
// registers the Caddy modules. The package imports neither the root
// package nor Caddy's http app.
package admin
