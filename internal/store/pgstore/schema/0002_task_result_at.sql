-- Version 2: when a task's result arrived (Unix nanoseconds; NULL while
-- none has), set in the transaction that stores the result.
ALTER TABLE tasks ADD COLUMN result_at bigint;
UPDATE tasks t SET result_at = r.received_at
	FROM records r WHERE r.provider = t.provider AND r.id = t.id AND t.state = 'done';
