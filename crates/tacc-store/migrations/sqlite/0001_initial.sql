-- Tasks and their whole history. JSON columns hold values the store does not interpret.
CREATE TABLE tasks (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    name             TEXT    NOT NULL,
    user_name        TEXT    NOT NULL,
    spec             TEXT    NOT NULL,
    snapshot         TEXT    NOT NULL,
    source           TEXT,
    state            TEXT    NOT NULL,
    reason           TEXT,
    exit_code        INTEGER,
    attempt          INTEGER NOT NULL,
    placements       TEXT    NOT NULL DEFAULT '[]',
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    submitted_at     INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER
);
CREATE INDEX tasks_by_state ON tasks (state, id);

CREATE TABLE task_events (
    task_id  INTEGER NOT NULL REFERENCES tasks (id),
    seq      INTEGER NOT NULL,
    at       INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    state    TEXT    NOT NULL,
    reason   TEXT,
    PRIMARY KEY (task_id, seq)
);

CREATE TABLE nodes (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL UNIQUE,
    capacity      TEXT    NOT NULL,
    gpu_type      TEXT,
    labels        TEXT    NOT NULL DEFAULT '{}',
    address       TEXT    NOT NULL,
    registered_at INTEGER NOT NULL
);

CREATE TABLE snapshots (
    id          TEXT    PRIMARY KEY,
    manifest    TEXT    NOT NULL,
    total_bytes INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE outputs (
    task_id  INTEGER NOT NULL REFERENCES tasks (id),
    attempt  INTEGER NOT NULL,
    path     TEXT    NOT NULL,
    size     INTEGER NOT NULL,
    PRIMARY KEY (task_id, attempt, path)
);
