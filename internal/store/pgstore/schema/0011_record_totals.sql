-- Version 11: count rows that do not churn. Until now each pingback wrote
-- about four count-row versions: +1 'forwarding' in record_counts and the
-- last callback time in last_callbacks at its insert, then -1 'forwarding'
-- and +1 'delivered' at its outcome; every one a dead version that no
-- pruning or vacuum can take away while another session's snapshot is
-- older (measured with bench/pg-churn.sh). Now:
--   - record_totals keeps, per (provider, shard), the number of records
--     and the newest live pingback's time (what last_callbacks kept): an
--     insert statement writes one version of one row;
--   - record_counts keeps only the states a record stays in ('queued',
--     'failed', 'rejected', 'parked', 'quarantined'), so a forward that
--     succeeds writes no count row at all;
--   - 'forwarding' records (in flight, under a lease) are counted where
--     they are, through records_forwarding; 'delivered' is the total less
--     every other state, in the same snapshot.
--   - task_counts keeps only 'pending' (the one task state read), so a
--     result that completes its task writes one version, not two.

-- The records are counted into record_totals below: an instance of the
-- previous version that still writes while this runs would insert records
-- this count misses for good, so writers wait until the migration commits
-- (after it, their inserts run the new trigger function).
LOCK TABLE records IN SHARE MODE;

CREATE TABLE record_totals (
	provider      text    NOT NULL,
	shard         integer NOT NULL,
	n             bigint  NOT NULL,
	last_callback bigint,
	PRIMARY KEY (provider, shard)
);
INSERT INTO record_totals (provider, shard, n, last_callback)
	SELECT provider, 0, sum(n), max(at) FROM (
		SELECT provider, count(*) AS n, NULL::bigint AS at FROM records GROUP BY provider
		UNION ALL SELECT provider, 0, at FROM last_callbacks) v
	GROUP BY provider;

DELETE FROM record_counts WHERE state IN ('forwarding', 'delivered');
DELETE FROM task_counts WHERE state <> 'pending';

CREATE INDEX records_forwarding ON records (provider) WHERE state = 'forwarding';

-- count_record_rows: for an insert, +1 per new row in its provider's
-- record_totals shard (and the newest live pingback's time), then +1 in
-- record_counts for each new row in a kept state; for an update, the
-- changes of kept states (+1 new, -1 old; a 'forwarding' to 'delivered'
-- update writes nothing); for a delete, -1 per old row in record_totals
-- and in record_counts for kept states. Every statement takes
-- record_totals before record_counts, keys in order.
CREATE OR REPLACE FUNCTION count_record_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO record_totals (provider, shard, n, last_callback)
			SELECT provider, pg_backend_pid() % 16, count(*),
				max(received_at) FILTER (WHERE source = 'callback') FROM new_rows
			GROUP BY provider ORDER BY provider
			ON CONFLICT (provider, shard) DO UPDATE SET n = record_totals.n + excluded.n,
				last_callback = greatest(record_totals.last_callback, excluded.last_callback);
		INSERT INTO record_counts (provider, state, shard, n)
			SELECT provider, state, pg_backend_pid() % 16, count(*) FROM new_rows
			WHERE state NOT IN ('forwarding', 'delivered')
			GROUP BY provider, state ORDER BY provider, state
			ON CONFLICT (provider, state, shard) DO UPDATE SET n = record_counts.n + excluded.n;
	ELSIF TG_OP = 'UPDATE' THEN
		INSERT INTO record_counts (provider, state, shard, n)
			SELECT provider, state, pg_backend_pid() % 16, sum(d) FROM (
				SELECT provider, state, 1 AS d FROM new_rows WHERE state NOT IN ('forwarding', 'delivered')
				UNION ALL SELECT provider, state, -1 FROM old_rows WHERE state NOT IN ('forwarding', 'delivered')) c
			GROUP BY provider, state HAVING sum(d) <> 0 ORDER BY provider, state
			ON CONFLICT (provider, state, shard) DO UPDATE SET n = record_counts.n + excluded.n;
	ELSE
		INSERT INTO record_totals (provider, shard, n)
			SELECT provider, pg_backend_pid() % 16, -count(*) FROM old_rows
			GROUP BY provider ORDER BY provider
			ON CONFLICT (provider, shard) DO UPDATE SET n = record_totals.n + excluded.n;
		INSERT INTO record_counts (provider, state, shard, n)
			SELECT provider, state, pg_backend_pid() % 16, -count(*) FROM old_rows
			WHERE state NOT IN ('forwarding', 'delivered')
			GROUP BY provider, state ORDER BY provider, state
			ON CONFLICT (provider, state, shard) DO UPDATE SET n = record_counts.n + excluded.n;
	END IF;
	RETURN NULL;
END $$;

DROP TRIGGER records_last_callback ON records;
DROP FUNCTION note_last_callback();
DROP TABLE last_callbacks;

-- count_task_rows (0009_accounts.sql), for 'pending' tasks only.
CREATE OR REPLACE FUNCTION count_task_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO task_counts (provider, account, state, shard, n)
			SELECT provider, account, state, pg_backend_pid() % 16, count(*) FROM new_rows
			WHERE state = 'pending'
			GROUP BY provider, account, state ORDER BY provider, account, state
			ON CONFLICT (provider, account, state, shard) DO UPDATE SET n = task_counts.n + excluded.n;
	ELSIF TG_OP = 'UPDATE' THEN
		INSERT INTO task_counts (provider, account, state, shard, n)
			SELECT provider, account, state, pg_backend_pid() % 16, sum(d) FROM (
				SELECT provider, account, state, 1 AS d FROM new_rows WHERE state = 'pending'
				UNION ALL SELECT provider, account, state, -1 FROM old_rows WHERE state = 'pending') c
			GROUP BY provider, account, state HAVING sum(d) <> 0 ORDER BY provider, account, state
			ON CONFLICT (provider, account, state, shard) DO UPDATE SET n = task_counts.n + excluded.n;
	ELSE
		INSERT INTO task_counts (provider, account, state, shard, n)
			SELECT provider, account, state, pg_backend_pid() % 16, -count(*) FROM old_rows
			WHERE state = 'pending'
			GROUP BY provider, account, state ORDER BY provider, account, state
			ON CONFLICT (provider, account, state, shard) DO UPDATE SET n = task_counts.n + excluded.n;
	END IF;
	RETURN NULL;
END $$;
