-- Adaptive allocation. Every change of a running attempt's per-node CPU and memory, with
-- its reason: the latest of the current attempt is the allocation in force, which a
-- restarted server gives back to the scheduler.
CREATE TABLE task_resizes (
    task_id      INTEGER NOT NULL REFERENCES tasks (id),
    seq          INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    at           INTEGER NOT NULL,
    cpu_millis   INTEGER NOT NULL,
    memory_bytes INTEGER NOT NULL,
    reason       TEXT    NOT NULL,
    PRIMARY KEY (task_id, seq)
);

-- A down-sampled series of each attempt's signals and verdicts (a JSON point the store
-- does not interpret), bounded per attempt, for `tcloud top ID` and `tcloud show ID`.
CREATE TABLE signal_points (
    task_id INTEGER NOT NULL REFERENCES tasks (id),
    attempt INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    point   TEXT    NOT NULL,
    PRIMARY KEY (task_id, attempt, at)
);
