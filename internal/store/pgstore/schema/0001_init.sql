-- Version 1 of the PostgreSQL store's schema: results, tracked tasks and
-- the poller's shared per-provider state. Applied once, under the
-- migration advisory lock, in the store's schema (search_path).
--
-- Times are Unix nanoseconds (bigint; NULL for none), so that every time
-- the plugin stores reads back exactly (timestamptz keeps microseconds);
-- to_timestamp(x / 1e9) shows one. now_ns() is the database's clock, by
-- which leases are measured.

CREATE FUNCTION now_ns() RETURNS bigint
	LANGUAGE sql STABLE
	AS $$ SELECT (extract(epoch FROM now()) * 1000000000)::bigint $$;

-- One row per result (provider, task id): the deduplication key.
CREATE TABLE records (
	provider     text    NOT NULL,
	id           text    NOT NULL,
	code         bytea   NOT NULL, -- as received: any bytes (text cannot hold NUL)
	answer       bytea,            -- the provider's whole JSON answer, if it came as JSON
	source       text    NOT NULL,
	received_at  bigint,
	submitted_at bigint,
	server       text    NOT NULL DEFAULT '',
	request      bytea   NOT NULL, -- store.Request as JSON (body in base64), never parsed by SQL
	state        text    NOT NULL,
	attempts     integer NOT NULL DEFAULT 0,
	failures     integer NOT NULL DEFAULT 0,
	interrupts   integer NOT NULL DEFAULT 0,
	due_at       bigint,           -- queued and failed only
	lease_owner  text,             -- forwarding only
	lease_until  bigint,           -- forwarding only; compared with now_ns()
	last_status  integer NOT NULL DEFAULT 0,
	last_error   text    NOT NULL DEFAULT '',
	updated_at   bigint,
	expires_at   bigint  NOT NULL,
	PRIMARY KEY (provider, id)
);

-- Claim due: queued and failed records by due time.
CREATE INDEX records_due ON records (due_at) WHERE state IN ('queued', 'failed');
-- Claim lapsed leases: forwarding records by lease end.
CREATE INDEX records_lease ON records (lease_until) WHERE state = 'forwarding';
-- List by state, ordered by key (the admin API's dead-letter queue).
CREATE INDEX records_state ON records (state, provider, id);
-- Retention sweep.
CREATE INDEX records_expires ON records (expires_at);

-- Tracked tasks, polled while pending.
CREATE TABLE tasks (
	provider     text    NOT NULL,
	id           text    NOT NULL,
	method       text    NOT NULL DEFAULT '',
	api          text    NOT NULL DEFAULT '', -- '' or 'legacy' (in.php), 'json' (createTask)
	submitted_at bigint,
	pingback_url text    NOT NULL,
	server       text    NOT NULL DEFAULT '',
	state        text    NOT NULL,
	next_poll_at bigint,
	polls        integer NOT NULL DEFAULT 0,
	app_polls    integer NOT NULL DEFAULT 0,
	app_polled_at bigint,
	last_error   text    NOT NULL DEFAULT '',
	updated_at   bigint,
	expires_at   bigint  NOT NULL,
	PRIMARY KEY (provider, id)
);

-- Claim tasks: pending tasks by next poll time.
CREATE INDEX tasks_due ON tasks (next_poll_at) WHERE state = 'pending';
CREATE INDEX tasks_expires ON tasks (expires_at);

-- The poller's per-provider state shared by every instance: the res.php
-- budget (requests made, tasks tracked) and the rate limiter's next free
-- slot, by the database's clock.
CREATE TABLE providers (
	provider  text   PRIMARY KEY,
	polls     bigint NOT NULL DEFAULT 0,
	tracked   bigint NOT NULL DEFAULT 0,
	next_slot bigint NOT NULL DEFAULT 0
);

-- Recent submit-to-pingback delays, for the shared automatic "after".
CREATE TABLE latencies (
	seq      bigserial PRIMARY KEY,
	provider text      NOT NULL,
	delay_ns bigint    NOT NULL
);
CREATE INDEX latencies_provider ON latencies (provider, seq);
