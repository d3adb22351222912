-- Version 9: several API keys (accounts) per provider. A task remembers
-- the account id of the key it was submitted with (never the key; '' for
-- a task stored before: the store stamps those with
-- PostgresOptions.LegacyAccounts in this migration's transaction, after
-- this file), and the poller's shared state is kept per account.

ALTER TABLE tasks ADD COLUMN account text NOT NULL DEFAULT '';

-- DueTasks: pending tasks of the accounts asked for, by next poll time, one
-- index range per account; the due tasks of other accounts (another
-- instance's keys on a shared database, keys this one lacks) are never
-- read. It serves every query tasks_due did.
DROP INDEX tasks_due;
CREATE INDEX tasks_due_account ON tasks (provider, account, next_poll_at, id COLLATE "C") WHERE state = 'pending';

-- ListTaskPage with an account, with or without a state (as
-- tasks_submitted and tasks_state_submitted, migration 0007).
CREATE INDEX tasks_account_submitted ON tasks (account, (coalesce(submitted_at, 0)), provider COLLATE "C", id COLLATE "C");
CREATE INDEX tasks_account_state_submitted ON tasks (account, state, (coalesce(submitted_at, 0)), provider COLLATE "C", id COLLATE "C");
-- The states of an account are far from those of the table (one account
-- with few pending tasks among many of other accounts): statistics of
-- the pair let the planner see it and choose the index of both.
CREATE STATISTICS tasks_account_state (mcv) ON account, state FROM tasks;

-- Task counts by account too (Counts.TasksPendingByAccount): task_counts
-- gains the account in its key, rebuilt from the rows, and its triggers
-- count by (provider, account, state). record_counts keeps count_rows.
DROP TRIGGER tasks_count_insert ON tasks;
DROP TRIGGER tasks_count_update ON tasks;
DROP TRIGGER tasks_count_delete ON tasks;
DROP TABLE task_counts;
CREATE TABLE task_counts (
	provider text    NOT NULL,
	account  text    NOT NULL,
	state    text    NOT NULL,
	shard    integer NOT NULL,
	n        bigint  NOT NULL,
	PRIMARY KEY (provider, account, state, shard)
);
INSERT INTO task_counts SELECT provider, account, state, 0, count(*) FROM tasks GROUP BY provider, account, state;

-- count_task_rows is count_rows (0003_counts.sql) for task_counts, by
-- (provider, account, state).
CREATE FUNCTION count_task_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO task_counts (provider, account, state, shard, n)
			SELECT provider, account, state, pg_backend_pid() % 16, count(*) FROM new_rows
			GROUP BY provider, account, state ORDER BY provider, account, state
			ON CONFLICT (provider, account, state, shard) DO UPDATE SET n = task_counts.n + excluded.n;
	ELSIF TG_OP = 'UPDATE' THEN
		INSERT INTO task_counts (provider, account, state, shard, n)
			SELECT provider, account, state, pg_backend_pid() % 16, sum(d) FROM (
				SELECT provider, account, state, 1 AS d FROM new_rows
				UNION ALL SELECT provider, account, state, -1 FROM old_rows) c
			GROUP BY provider, account, state HAVING sum(d) <> 0 ORDER BY provider, account, state
			ON CONFLICT (provider, account, state, shard) DO UPDATE SET n = task_counts.n + excluded.n;
	ELSE
		INSERT INTO task_counts (provider, account, state, shard, n)
			SELECT provider, account, state, pg_backend_pid() % 16, -count(*) FROM old_rows
			GROUP BY provider, account, state ORDER BY provider, account, state
			ON CONFLICT (provider, account, state, shard) DO UPDATE SET n = task_counts.n + excluded.n;
	END IF;
	RETURN NULL;
END $$;

CREATE TRIGGER tasks_count_insert AFTER INSERT ON tasks
	REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_task_rows();
CREATE TRIGGER tasks_count_update AFTER UPDATE ON tasks
	REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION count_task_rows();
CREATE TRIGGER tasks_count_delete AFTER DELETE ON tasks
	REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION count_task_rows();

-- The poller's shared state (budget, rate limit) per account: the
-- per-provider rows become those of account ''.
ALTER TABLE providers ADD COLUMN account text NOT NULL DEFAULT '';
ALTER TABLE providers DROP CONSTRAINT providers_pkey;
ALTER TABLE providers ADD PRIMARY KEY (provider, account);
