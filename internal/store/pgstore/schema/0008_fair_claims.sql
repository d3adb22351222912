-- Version 8: fair claims (ClaimRequest.Reserved). The due records with at
-- most FewFailures (2) failures, by due time, so that the claim's fair
-- pass reads them without walking a backlog of records that failed more
-- often. The literal 2 is the claim query's: the planner uses a partial
-- index only for a query whose condition implies its predicate.
CREATE INDEX records_fair ON records (due_at) WHERE state IN ('queued', 'failed') AND failures <= 2;
