-- Version 14: payload minimisation (keep_payload). A delivered result's
-- payload (code, answer, other_code, the request's body, headers and
-- query) is erased keep_payload after its delivery; payload_erased says it
-- was. The partial index holds the delivered records not yet erased by
-- delivery time (updated_at), so the sweep reads the ones due first and
-- nothing else; an erased record leaves it.
ALTER TABLE records ADD COLUMN payload_erased boolean NOT NULL DEFAULT false;
CREATE INDEX records_payload_due ON records (updated_at) WHERE state = 'delivered' AND NOT payload_erased;
