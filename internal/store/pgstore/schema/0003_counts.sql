-- Version 3: counts of records by provider and state, and of tasks by
-- provider and state, kept by statement-level triggers in the same
-- transactions as the rows they count (so every instance reads the same,
-- database-wide figures without scanning). Each connection adds to its own
-- shard (backend pid modulo 16), so that concurrent group commits seldom
-- wait for each other's counter rows; a read sums the shards.

CREATE TABLE record_counts (
	provider text    NOT NULL,
	state    text    NOT NULL,
	shard    integer NOT NULL,
	n        bigint  NOT NULL,
	PRIMARY KEY (provider, state, shard)
);
INSERT INTO record_counts SELECT provider, state, 0, count(*) FROM records GROUP BY provider, state;

CREATE TABLE task_counts (
	provider text    NOT NULL,
	state    text    NOT NULL,
	shard    integer NOT NULL,
	n        bigint  NOT NULL,
	PRIMARY KEY (provider, state, shard)
);
INSERT INTO task_counts SELECT provider, state, 0, count(*) FROM tasks GROUP BY provider, state;

-- count_rows adds the statement's changes to the counts table named by
-- its argument: +1 for each new row's (provider, state), -1 for each old
-- row's; rows whose state did not change cancel out. Keys are taken in
-- order, so two transactions never wait for each other in a cycle.
CREATE FUNCTION count_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		EXECUTE format('INSERT INTO %I (provider, state, shard, n)
			SELECT provider, state, pg_backend_pid() %% 16, count(*) FROM new_rows
			GROUP BY provider, state ORDER BY provider, state
			ON CONFLICT (provider, state, shard) DO UPDATE SET n = %I.n + excluded.n', TG_ARGV[0], TG_ARGV[0]);
	ELSIF TG_OP = 'UPDATE' THEN
		EXECUTE format('INSERT INTO %I (provider, state, shard, n)
			SELECT provider, state, pg_backend_pid() %% 16, sum(d) FROM (
				SELECT provider, state, 1 AS d FROM new_rows
				UNION ALL SELECT provider, state, -1 FROM old_rows) c
			GROUP BY provider, state HAVING sum(d) <> 0 ORDER BY provider, state
			ON CONFLICT (provider, state, shard) DO UPDATE SET n = %I.n + excluded.n', TG_ARGV[0], TG_ARGV[0]);
	ELSE
		EXECUTE format('INSERT INTO %I (provider, state, shard, n)
			SELECT provider, state, pg_backend_pid() %% 16, -count(*) FROM old_rows
			GROUP BY provider, state ORDER BY provider, state
			ON CONFLICT (provider, state, shard) DO UPDATE SET n = %I.n + excluded.n', TG_ARGV[0], TG_ARGV[0]);
	END IF;
	RETURN NULL;
END $$;

CREATE TRIGGER records_count_insert AFTER INSERT ON records
	REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_rows('record_counts');
CREATE TRIGGER records_count_update AFTER UPDATE ON records
	REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_rows('record_counts');
CREATE TRIGGER records_count_delete AFTER DELETE ON records
	REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION count_rows('record_counts');
CREATE TRIGGER tasks_count_insert AFTER INSERT ON tasks
	REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_rows('task_counts');
CREATE TRIGGER tasks_count_update AFTER UPDATE ON tasks
	REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_rows('task_counts');
CREATE TRIGGER tasks_count_delete AFTER DELETE ON tasks
	REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION count_rows('task_counts');
