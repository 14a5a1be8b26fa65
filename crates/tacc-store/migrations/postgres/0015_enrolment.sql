-- Enrolment (issue 22): a join token enrols at most `enrol_limit` nodes (one unless the
-- operator asked for more), only `bound_node` when set; `enrolled` counts its uses and
-- `enrolments` says which names used it. Join tokens issued before this change become
-- single-use. A node keeps the capacity it enrolled with (growing beyond it needs a new
-- enrolment) and, where the operator requires approval, waits `pending` until approved.
ALTER TABLE tokens ADD COLUMN bound_node TEXT;
ALTER TABLE tokens ADD COLUMN enrol_limit BIGINT;
ALTER TABLE tokens ADD COLUMN enrolled BIGINT NOT NULL DEFAULT 0;
UPDATE tokens SET enrol_limit = 1 WHERE kind = 'agent_join';

CREATE TABLE enrolments (
    token_id  BIGINT  NOT NULL,
    node_name TEXT    NOT NULL,
    at        BIGINT  NOT NULL,
    PRIMARY KEY (token_id, node_name)
);

ALTER TABLE nodes ADD COLUMN enrolled_capacity TEXT;
UPDATE nodes SET enrolled_capacity = capacity;
ALTER TABLE nodes ADD COLUMN pending BIGINT NOT NULL DEFAULT 0;
