-- Adaptive allocation. Every change of a running attempt's per-node CPU and memory, with
-- its reason: the latest of the current attempt is the allocation in force, which a
-- restarted server gives back to the scheduler.
CREATE TABLE task_resizes (
    task_id      BIGINT  NOT NULL REFERENCES tasks (id),
    seq          BIGINT  NOT NULL,
    attempt      BIGINT  NOT NULL,
    at           BIGINT  NOT NULL,
    cpu_millis   BIGINT  NOT NULL,
    memory_bytes BIGINT  NOT NULL,
    reason       TEXT    NOT NULL,
    PRIMARY KEY (task_id, seq)
);

-- A down-sampled series of each attempt's signals and verdicts (a JSON point the store
-- does not interpret), bounded per attempt, for `tcloud top ID` and `tcloud show ID`.
CREATE TABLE signal_points (
    task_id BIGINT  NOT NULL REFERENCES tasks (id),
    attempt BIGINT  NOT NULL,
    at      BIGINT  NOT NULL,
    point   TEXT    NOT NULL,
    PRIMARY KEY (task_id, attempt, at)
);
