-- Metrics a task reports (`$TACC_METRICS`): one row per reported line, per attempt in
-- the order of arrival, the named values as a JSON object. Bounded per attempt by the
-- store (the first points are kept).
CREATE TABLE task_metrics (
    task_id BIGINT  NOT NULL REFERENCES tasks (id),
    attempt BIGINT  NOT NULL,
    seq     BIGINT  NOT NULL,
    step    BIGINT  NOT NULL,
    at      BIGINT  NOT NULL,
    metrics TEXT    NOT NULL,
    PRIMARY KEY (task_id, attempt, seq)
);
