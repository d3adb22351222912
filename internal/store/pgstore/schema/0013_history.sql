-- Version 13: the history's minute records (store.HistoryStore): one row
-- per minute and instance, written once a minute by each instance (an
-- upsert: a re-write of the minute replaces the row), read by a range of
-- minutes and pruned with retention. figures is the record's JSON:
-- counts by result and outcome, the backlog sample and the histogram
-- bucket counts, a few hundred bytes. Nothing else reads or writes it:
-- no trigger, no count.
CREATE TABLE history_minutes (
	minute   bigint NOT NULL, -- the minute's start, Unix seconds
	instance text   NOT NULL, -- the writing store handle's owner
	figures  jsonb  NOT NULL,
	PRIMARY KEY (minute, instance)
);
