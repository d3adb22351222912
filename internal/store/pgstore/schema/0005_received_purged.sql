-- Version 5: records listed by received time in pages (ListPage), and the
-- tombstones of purged records.
--
-- The order is received time, then provider and id compared bytewise (the
-- "C" collation), the same on every store. The state index gains the
-- received time, so that a page of one state (the dead-letter queue)
-- reads only that state's rows; it replaces records_state.
DROP INDEX records_state;
CREATE INDEX records_received ON records (received_at, provider COLLATE "C", id COLLATE "C");
CREATE INDEX records_state_received ON records (state, received_at, provider COLLATE "C", id COLLATE "C");

-- A purged record's key, kept until the record's retention ends: an
-- insert of the key is a duplicate, never stored again.
CREATE TABLE purged (
	provider   text   NOT NULL,
	id         text   NOT NULL,
	expires_at bigint NOT NULL,
	PRIMARY KEY (provider, id)
);
CREATE INDEX purged_expires ON purged (expires_at);
