-- Version 12: pauses of deliveries (store.Pauser), one row per paused
-- provider ('*' for every provider), read by every instance at least
-- twice a second. Times in Unix nanoseconds, like every other table;
-- until is NULL for a pause without an end.
CREATE TABLE pauses (
	provider  text   PRIMARY KEY,
	reason    text   NOT NULL DEFAULT '',
	since     bigint NOT NULL,
	until     bigint,
	paused_by text   NOT NULL DEFAULT ''
);
