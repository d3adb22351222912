-- Version 7: tasks listed by submission time in pages (ListTaskPage).
--
-- The order is submission time (a task without one, NULL, first, as 0),
-- then provider and id compared bytewise (the "C" collation), the same on
-- every store. The state index serves a page of one state (and of one
-- provider in it) from that state's rows only.
CREATE INDEX tasks_submitted ON tasks ((coalesce(submitted_at, 0)), provider COLLATE "C", id COLLATE "C");
CREATE INDEX tasks_state_submitted ON tasks (state, (coalesce(submitted_at, 0)), provider COLLATE "C", id COLLATE "C");
