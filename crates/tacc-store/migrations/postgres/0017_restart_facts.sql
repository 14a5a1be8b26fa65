-- What a restarted server needs to carry on as if it had never stopped.
-- How each node rank of a multi-node attempt ended, recorded with the change that applied
-- it: a rank that finished is not lost when the server restarts, and the first failure
-- stays the one named.
CREATE TABLE attempt_ranks (
    task_id   BIGINT  NOT NULL REFERENCES tasks (id),
    attempt   BIGINT  NOT NULL,
    node_rank BIGINT  NOT NULL,
    node_id   BIGINT  NOT NULL,
    at        BIGINT  NOT NULL,
    failure   TEXT,
    PRIMARY KEY (task_id, attempt, node_rank)
);

-- Each group's decaying fair-share usage (a JSON ledger: value, rate, at), so the standing
-- does not reset with the server.
CREATE TABLE fairshare_ledgers (
    group_name TEXT PRIMARY KEY,
    ledger     TEXT NOT NULL
);

-- When the server last heard from each node.
ALTER TABLE nodes ADD COLUMN last_seen_at BIGINT;

-- Dashboard sessions, so a restarted server does not sign everyone out: keyed by the
-- SHA-256 of the session id (the id itself is only in the browser's cookie), the API token
-- and form token sealed with the server's secret key.
CREATE TABLE dashboard_sessions (
    session_key TEXT   PRIMARY KEY,
    user_name   TEXT   NOT NULL,
    nonce       BYTEA  NOT NULL,
    sealed      BYTEA  NOT NULL,
    opened_at   BIGINT NOT NULL
);

-- GPU time each rank used (milliseconds of one GPU fully busy), for idle GPU-hours.
ALTER TABLE usage_peaks ADD COLUMN gpu_busy_ms BIGINT NOT NULL DEFAULT 0;

-- A user's runs of one task name, newest first: their typical run length makes start
-- estimates likelier.
CREATE INDEX tasks_by_user_and_name ON tasks (user_name, name, id);
