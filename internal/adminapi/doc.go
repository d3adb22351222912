// Package adminapi holds the JSON shapes the pingback admin API answers and
// the CLI reads (and the bodies the API takes): the status overview
// (Status), the pages of stored results and tracked tasks (RecordsPage,
// TasksPage), the filter of a bulk replay, a purge and a list
// (ReplayFilter), a bulk replay's progress (ReplayJobState), a purge's
// count (PurgeAnswer) and a task registration (TaskRegistration).
//
// The admin handlers encode these types and `caddy pingback` decodes them,
// so both sides read the same fields by construction. The package holds
// shapes only: no routes, no Caddy, no store access.
package adminapi
