-- Version 6: verification (issue 12): how each result
-- was verified, whether its task was tracked, why it is quarantined, the
-- conflicting code that lost (bytes, like code), whether its code
-- corrected one the app was sent; and each task's pingback token.
ALTER TABLE records ADD COLUMN verified text NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN tracked boolean NOT NULL DEFAULT false;
ALTER TABLE records ADD COLUMN quarantine text NOT NULL DEFAULT '';
ALTER TABLE records ADD COLUMN other_code bytea;
ALTER TABLE records ADD COLUMN correction boolean NOT NULL DEFAULT false;
ALTER TABLE tasks ADD COLUMN token text NOT NULL DEFAULT '';
