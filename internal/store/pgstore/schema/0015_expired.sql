-- The expired state (store.StateExpired): a result older than its
-- provider's max_age when a replay or its polled delivery was due, kept
-- and never forwarded automatically. expired_reason says why ('max_age');
-- '' in every other state. A column with a constant default is added
-- without rewriting the table.
--
-- The counts need no change: count_record_rows (0011_record_totals.sql)
-- keeps in record_counts every state but 'forwarding' and 'delivered', so
-- 'expired' is counted there like 'parked', and Counts reads 'delivered'
-- as a provider's total less its other states, 'expired' included.
-- records_state (0001_init.sql) lists it by state like the others.

ALTER TABLE records ADD COLUMN expired_reason text NOT NULL DEFAULT '';
