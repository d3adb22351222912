-- Version 4 (the history and age gauges of issue 10): each record's
-- per-attempt history, and what the age gauges read without scanning.

-- store.Delivery.History as JSON; NULL for none.
ALTER TABLE records ADD COLUMN history bytea;

-- The retry backlog's oldest result by provider (Ages.OldestUndelivered):
-- one index descent per provider.
CREATE INDEX records_backlog ON records (provider, received_at) WHERE state IN ('failed', 'forwarding');
-- The oldest pending task by provider (Ages.OldestPendingTask).
CREATE INDEX tasks_pending_age ON tasks (provider, submitted_at) WHERE state = 'pending';

-- The newest live pingback by provider (Ages.LastCallback), kept by a
-- statement-level trigger in the inserts' own transactions, sharded like
-- the counts (backend pid modulo 16) so that concurrent group commits
-- seldom wait for each other; a read takes the greatest shard.
CREATE TABLE last_callbacks (
	provider text    NOT NULL,
	shard    integer NOT NULL,
	at       bigint  NOT NULL,
	PRIMARY KEY (provider, shard)
);
INSERT INTO last_callbacks SELECT provider, 0, max(received_at) FROM records
	WHERE source = 'callback' AND received_at IS NOT NULL GROUP BY provider;

CREATE FUNCTION note_last_callback() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO last_callbacks (provider, shard, at)
		SELECT provider, pg_backend_pid() % 16, max(received_at) FROM new_rows
		WHERE source = 'callback' AND received_at IS NOT NULL
		GROUP BY provider ORDER BY provider
		ON CONFLICT (provider, shard) DO UPDATE SET at = greatest(last_callbacks.at, excluded.at);
	RETURN NULL;
END $$;

CREATE TRIGGER records_last_callback AFTER INSERT ON records
	REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION note_last_callback();
